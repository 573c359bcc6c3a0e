//! hotverbs-softnic: an in-process RDMA device behind the verbs ABI.
//!
//! softnic is a device, not a code path. Its objects are the public ABI structs
//! (`ibv_context` with a filled `ops` table inside an extended `verbs_context`, `ibv_pd`,
//! `ibv_mr`, `ibv_cq` / `ibv_cq_ex`, `ibv_qp` / `ibv_qp_ex`, `ibv_srq`, `ibv_ah`,
//! `ibv_comp_channel`, `ibv_td`), so `hotverbs_ffi::inline::ibv_post_send` on a
//! softnic QP dispatches through `qp->context->ops.post_send` into softnic exactly as it
//! reaches librxe or libmlx5. The setup verbs come as the same function-table type that
//! libibverbs is loaded into: [`verbs_table`] returns a `&'static IbvFns` whose entries are
//! softnic's `unsafe extern "C" fn`s with libibverbs' return conventions.
//!
//! # Tour
//! - [`verbs_table`]: the table (`ibv_get_device_list` lists one device, `"softnic"`).
//! - [`open_device`] + [`Config`]: an extra device with custom limits, usable through the
//!   same table.
//! - [`Profile`]: `Spec` (the man pages) or `Rxe` (rxe as measured); see "Profiles" below.
//!   [`device_profile`] tells a test which one a context's device follows.
//! - [`inject_qp_error`], [`inject_cq_overflow`], [`sq_outstanding`], [`rq_outstanding`],
//!   [`srq_outstanding`], [`send_wrs_waiting`]: test hooks.
//! - `fabric` (private): the process-wide object registry and the work-request engine
//!   (one mutex; work executes synchronously inside `post_send`).
//! - `mem` (private): the only module that touches application memory (registered,
//!   bounds-checked ranges only).
//! - `verbs` (private): the `extern "C"` verbs; `strings` (private): the `*_str` verbs.
//! - `ex` (private): the extended verbs — the `verbs_context` ops (`query_device_ex`,
//!   `create_qp_ex`, `create_cq_ex`, `alloc_td`, `dealloc_td`, `alloc_parent_domain`,
//!   `query_rt_values`), the `ibv_qp_ex` work-request builders and the `ibv_cq_ex` poll and
//!   read functions; see "Extended verbs" below. [`HCA_CORE_CLOCK_KHZ`]: the declared clock
//!   of completion timestamps.
//! - [`counting`]: the counting test device.
//! - [`Config::mlx5`]: the mlx5 personality, a simulated ConnectX behind
//!   [`mlx5dv_init_obj`], run by [`mlx5_step`], every poll and a wait on a completion
//!   channel (see `fabric/dv.rs`).
//! - [`mlx5sim`]: a bare simulated ConnectX send queue and CQ, for the datapath's own tests.
//!
//! # Example
//! ```
//! use hotverbs_ffi::*;
//! let fns = hotverbs_softnic::verbs_table();
//! unsafe {
//!     let mut n = 0;
//!     let list = fns.ibv_get_device_list.unwrap()(&mut n);
//!     assert_eq!(n, 1);
//!     let ctx = fns.ibv_open_device.unwrap()(*list);
//!     fns.ibv_free_device_list.unwrap()(list);
//!     let pd = fns.ibv_alloc_pd.unwrap()(ctx);
//!     let cq = fns.ibv_create_cq.unwrap()(ctx, 16, core::ptr::null_mut(), core::ptr::null_mut(), 0);
//!     let mut wc = [ibv_wc::default(); 4];
//!     assert_eq!(inline::ibv_poll_cq(cq, 4, wc.as_mut_ptr()), 0);
//!     assert_eq!(fns.ibv_destroy_cq.unwrap()(cq), 0);
//!     assert_eq!(fns.ibv_dealloc_pd.unwrap()(pd), 0);
//!     assert_eq!(fns.ibv_close_device.unwrap()(ctx), 0);
//! }
//! ```
//!
//! # Behaviour, and what each choice follows
//! "man" = the libibverbs man page named; "rxe Sn/Gn" = the measured row of
//! `shared/rxe-vm/fault-truth.md`; "IBA" = the InfiniBand spec as the RDMA Aware Networks
//! Programming manual states it. Where rxe departs from the man pages, the `Spec` profile
//! (the default) follows the man page and the entry says so; the `Rxe` profile follows rxe,
//! as the table under "Profiles" lists. The sections below describe the `Spec` profile.
//!
//! ## Profiles
//! [`Config::profile`] selects the behaviour where rxe departs from the man pages. The
//! device `ibv_get_device_list` lists takes it from `HOTVERBS_SOFTNIC_PROFILE` (`spec` or
//! `rxe`, any case; unset = `spec`; anything else = `spec` with a warning on stderr), so every
//! test suite can run against both without a VM:
//! `HOTVERBS_SOFTNIC_PROFILE=rxe cargo test`. A test that checks a departure asks
//! [`device_profile`] and expects exactly that profile's row. The profile is cached in each
//! QP and CQ; the Spec hot path pays one field read.
//!
//! | fault-truth row | Spec | Rxe |
//! |---|---|---|
//! | S1, G1: post_send in RESET/INIT/RTR | EINVAL, `*bad_wr` = the first WR, nothing queued, errno untouched | EINVAL with errno EINVAL and `*bad_wr` NULL; the chain is validated and queued anyway (an invalid WR is still returned in `*bad_wr` with its errno); the queued WRs run, first, at the next post_send in RTS; ->RESET discards them, ->ERR flushes them |
//! | G2 | error and flush completions keep the WR's opcode (RECV for receives), byte_len 0, wc_flags 0 | opcode 0 (SEND), byte_len 0, wc_flags 0, receives included |
//! | G4 | successful RC/UC receive: no IBV_WC_GRH, src_qp = the sender's QPN | IBV_WC_GRH set, src_qp 0 (measured on RC; UC takes rxe's same path) |
//! | G7, S9, S10 | an error moving a QP to ERR raises QP_FATAL (requester, receiver) or QP_REQ_ERR / QP_ACCESS_ERR (responder); [`inject_qp_error`] raises QP_FATAL | no async event at all (QP_LAST_WQE_REACHED with an SRQ is kept in both: not measured) |
//! | S2 | post_recv in RESET: EINVAL, `*bad_wr` = the first WR | EINVAL, `*bad_wr` NULL, errno untouched, nothing queued |
//! | G9, S2 | post_recv in ERR: 0, flushed at once | 0, no completion until the next modify(ERR->ERR) flushes it; ->RESET discards it ([`rq_outstanding`] counts it meanwhile) |
//! | G10 | query_qp: cur_qp_state = the state | cur_qp_state 0 (RESET) |
//! | G11, S14, S22 | an RC request nobody answers (responder absent, destroyed, not in RTR/RTS, or it lost the message: S15) ends with RETRY_EXC_ERR at once, whatever retry_cnt and timeout | retry_cnt >= 7 (7 = infinite; rxe keeps 8 at 7 too) or timeout 0: the WR is held for ever — no completion, it and later WRs wait ([`send_wrs_waiting`]), retried when the responder comes to RTR, flushed when the QP goes to ERR, dropped at RESET; retry_cnt < 7: RETRY_EXC_ERR at once (no timers) |
//! | G12, S3, S4, S19 | SQ, RQ and CQ sizes exactly as requested | rounded up to 2^k - 1: create_qp echoes the request, query_qp reports the rounded depths and they are what can be posted; `ibv_cq.cqe` and the CQ's capacity are rounded (create and resize: 4 -> 7, 16 -> 31, 1 -> 1) |
//! | S3 | an SQ slot is released when a completion covering it is *polled* | released when the WR executes (the ACK), polled or not, signaled or not; only waiting WRs (RNR, held, queued before RTS) occupy the SQ. [`sq_outstanding`] reports the same quantity in both profiles: posted WRs not yet released by a polled completion |
//! | S5, S19 | create_qp returns max_inline_data and max_send_sge as requested; IBV_SEND_INLINE is ignored on RDMA READ | WQE size = max(16 x max_send_sge, max_inline_data) (at most the device's max_inline_data): the returned and usable inline size is that, max_send_sge is raised to size / 16; READ with INLINE: more than the inline size -> EINVAL at post, else LOC_PROT_ERR at execution, nothing written, the QP goes to ERR |
//! | S7 | a gather-side lkey naming no MR of the PD -> LOC_PROT_ERR | LOC_QP_OP_ERR (SGE bounds or access faults, and READ/atomic targets, stay LOC_PROT_ERR) |
//! | S8 | receive buffer the responder cannot write: LOC_PROT_ERR at the receiver, REM_OP_ERR at the sender; an SGE of 2^31 bytes fails its MR bounds: LOC_PROT_ERR | receiver LOC_QP_OP_ERR, sender REM_OP_ERR; a gather list of 2^31 bytes or more that does not fit its MRs -> LOC_QP_OP_ERR (rxe was measured with an SGE of 0x80000000 bytes on a small MR; softnic checks the size only when the gather fails, which keeps the check off the hot path) |
//! | S10 | atomic whose local SGE fails (bad lkey, bounds, no LOCAL_WRITE): LOC_PROT_ERR, the remote word untouched | LOC_PROT_ERR *after* the remote operation executed (the remote word changed), local buffer untouched; requester ERR, responder RTS |
//! | S11 | SEND longer than the receive: LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at the sender, both ERR, nothing written | LOC_QP_OP_ERR / REM_OP_ERR, both ERR, and the leading packets (sender's path MTU) that fit whole are written: 3000 B into 2048 B writes 2048 B, 64 B into 16 B writes nothing |
//! | S18 | too-short UD receive: LOC_LEN_ERR, the UD QP goes to ERR | LOC_QP_OP_ERR, the UD QP goes to ERR |
//! | S15 | CQ overflow: the completion is lost, the CQ enters the error state (`poll_cq` returns `-EOVERFLOW` until destroyed), one IBV_EVENT_CQ_ERR | the completion is silently dropped with one IBV_EVENT_CQ_ERR per drop, the CQ stays usable, `poll_cq` never errors; a *receive* completion lost this way moves the responder to ERR without acknowledging the message (RC requester: as an unanswered request, G11; UC/UD: success), and its flushes overflow too (one CQ_ERR each), so its remaining receives are lost |
//! | S15 test hook | [`inject_cq_overflow`]: the next completion puts the CQ in the error state | the next n completions are dropped as above |
//! | S17 | WRITE_WITH_IMM with no receive and rnr_retry < 7: RNR_RETRY_EXC_ERR, nothing written | RNR_RETRY_EXC_ERR, and every packet before the last (path MTU) was written: 3000 B writes 2048 B, 100 B nothing |
//! | ext: inline (rxe README, "Facts about rxe") | `ibv_wr_set_inline_data(_list)` inlines the data whatever `qpx->wr_flags` holds | inlined only with IBV_SEND_INLINE in `qpx->wr_flags`; without it the WR completes with LOC_QP_OP_ERR at execution (nothing written) and the QP goes to ERR, its later WRs flushed |
//! | ext: timestamps (rxe README) | `create_cq_ex` accepts IBV_WC_EX_WITH_COMPLETION_TIMESTAMP and ..._WALLCLOCK; `query_device_ex`: `completion_timestamp_mask` all ones, `hca_core_clock` [`HCA_CORE_CLOCK_KHZ`]; `query_rt_values_ex` gives the raw clock | either timestamp flag -> EOPNOTSUPP (librxe's RXE_SUP_WC_EX_FLAGS); mask 0 and `hca_core_clock` 0; `query_rt_values_ex` EOPNOTSUPP (librxe has no such op: libibverbs' dummy answers) |
//! | ext: domains (librxe source) | `alloc_td`, `dealloc_td`, `alloc_parent_domain` supported | librxe implements none of them, so libibverbs' dummy ops answer: `ibv_alloc_td` / `ibv_alloc_parent_domain` NULL + errno EOPNOTSUPP, `ibv_dealloc_td` EOPNOTSUPP |
//! | ext: builder limits | a batch with more WRs than the SQ holds, more SGEs than `max_send_sge`, or more inline bytes than `max_inline_data`: `wr_complete` returns ENOMEM (mlx5's `mqp->err`), nothing posted | ENOSPC (librxe's `qp->err`), nothing posted |
//! | ext: S1 | `wr_complete` before RTS: EINVAL, nothing posted | EINVAL from the doorbell, and the batch stays queued, run at the next post in RTS (as S1's post_send) |
//! | S21 | SEND_WITH_INV on RC: LOC_QP_OP_ERR at the sender, QP to ERR (no memory windows) | the sender succeeds; the responder consumes a receive, completes it with REM_INV_REQ_ERR and goes to ERR (softnic has no MWs or fast-registration MRs, so every rkey counts as bogus); no receive posted: RNR as a SEND |
//! | issue 31 (rxe0, by the differential of `cargo xtask rxe`) | - | D1: a UD remote Q_Key with the high bit is sent as it is; D2: a refused one-packet RC WRITE_WITH_IMM completes the responder's receive with REM_ACCESS_ERR (a longer one's receive is flushed, D9); D3: the GRH area's IPv4 header as rxe0 writes it (checksum 0); D4: a too-short UD receive gets the GRH area; D5: an error completion carries nothing past wr_id, status, qp_num (src_qp 0); D6: a UD send above the MTU succeeds before its lkey is read; D7: a READ's local SGE is checked after the remote side (a remote fault wins); D8: a one-packet WRITE_WITH_IMM without a receive is an RNR before its rkey is checked; D10: a post in RTS whose WR is refused still rings the doorbell, so WRs queued before RTS (S1) run |
//!
//! Rows where both profiles do the same (rxe's measured behaviour or the man page, which
//! agree): G1's errno rule for rejected WRs, G3, G5, G6, G8, S4's and S6's EINVAL/ENOMEM,
//! S9, S10 (status codes), S12 with rnr_retry 7, S13, S16, S18's drops and GRH, S19's
//! limits, S20, S21's EBUSY and opcode errors.
//!
//! Not modelled, in either profile:
//! - Timers: RNR waits (S12) and transport retries (S14, S21, S22) end at once when they are
//!   exhausted, not after (retry_cnt + 1) x timeout; a held WR (G11) is held without
//!   retransmissions.
//! - SQD (S14's SQ_DRAINED during an RNR loop): the state is not modelled.
//! - S15: whether rxe writes the payload of the message whose receive completion was lost
//!   was not measured; softnic writes it (the data lands before the completion).
//! - S19 "send_cq = NULL crashes libibverbs": softnic answers EINVAL.
//! - librxe bugs of rdma-core 44, fixed upstream: an extended CQ polled to `ibv_next_poll`
//!   ENOENT then `ibv_end_poll`, as the man page says, overruns its consumer index (fixed
//!   in rdma-core 55, b78b414e0; the setup layer's real-device tests pin it) and unlocks the
//!   CQ lock twice (fixed in 59, 5e7aa4102). softnic's extended poll behaves as the man page
//!   says in both profiles.
//! - The rxe extended opcodes softnic cannot execute (SEND_WITH_INV, LOCAL_INV, BIND_MW,
//!   FLUSH, ATOMIC_WRITE in `send_ops_flags`): EOPNOTSUPP at `create_qp_ex`, where rxe
//!   accepts them.
//!
//! ## Objects and limits
//! - Device defaults are rxe's (`ibv_devinfo -v` on rxe0): max_qp_wr 1048576, max_sge 32,
//!   max_cqe 32767, max_inline_data 512, max_srq_wr 1048576, max_srq_sge 27,
//!   max_qp_rd_atom 128, atomic_cap ATOMIC_HCA, one port.
//! - Port 1: ACTIVE, active_mtu 1024 and max_mtu 4096 (rxe on a 1500-byte netdev), link
//!   layer Ethernet, lid 0, gid_tbl_len 16. GID 0 is link-local (fe80::EUI-64 of the
//!   device GUID), GID 1 the RoCE v2 IPv4-mapped GID `::ffff:10.77.0.N` (rxe README: "GID
//!   index 1 is the RoCEv2 IPv4-mapped GID"); `_ibv_query_gid_ex` reports type ROCE_V2 and
//!   ENODATA for empty entries; `ibv_query_gid` of an empty entry gives zeros. P_Key 0 is
//!   0xffff.
//! - `ibv_create_qp(3)`: "the actual capabilities are >= the requested": softnic returns
//!   exactly the request (rxe rounds queue depths to 2^k-1, S3/S19; code that relies on
//!   rounding is wrong on mlx5 too). Any of max_send_wr/max_recv_wr > max_qp_wr,
//!   max_send_sge/max_recv_sge > max_sge, max_inline_data > the device's -> EINVAL (rxe
//!   S19). NULL send_cq/recv_cq -> EINVAL (libibverbs would crash, rxe S19). With an SRQ the
//!   returned max_recv_wr/max_recv_sge are 0 (man: "ignored"). A type other than RC/UC/UD
//!   -> EOPNOTSUPP.
//! - `ibv_create_cq(3)`: capacity exactly `cqe` (rxe rounds, S19); cqe < 1 or > max_cqe ->
//!   EINVAL (rxe S19). `ibv_resize_cq` below the current fill -> EINVAL.
//! - `ibv_create_srq(3)`: max_wr 0 or > max_srq_wr, max_sge > max_srq_sge -> EINVAL.
//! - Memory is provisioned when an object is created, never on the hot path: a CQ holds
//!   room for `cqe` completions, a QP or SRQ one entry per queue slot (with room for its
//!   SGE count and inline size) up to 4096 slots per queue, and the engine's scratch lists
//!   room for the largest SGE count. Posting and polling therefore allocate nothing from
//!   the first work request on (`tests/no_alloc.rs`); only queues deeper than 4096 grow on
//!   first use beyond that.
//! - `ibv_reg_mr(3)`: "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then
//!   IBV_ACCESS_LOCAL_WRITE must be set too" -> EINVAL otherwise. lkey == rkey; keys of
//!   deregistered MRs are never reused in the process. `ibv_reg_mr_iova(2)` supported
//!   (SGE and remote addresses are in the iova space).
//! - `ibv_reg_dmabuf_mr(3)`: softnic maps `length` bytes at `offset` of the fd (`mmap`,
//!   `MAP_SHARED`, read/write; any mappable fd, e.g. a memfd, stands in for a GPU buffer)
//!   and registers the mapping in the iova space, as `ibv_reg_mr_iova2`; `ibv_dereg_mr`
//!   unmaps it. The range must lie inside the file (`fstat`) -> EINVAL otherwise, as the
//!   kernel checks a dmabuf's size; shrinking the file afterwards is like freeing
//!   registered memory (a later access raises SIGBUS) — real dmabufs have a fixed size.
//!   `ibv_mr.addr` is softnic's mapping (libibverbs puts `offset` there). A device
//!   configured with `dmabuf: false` answers EOPNOTSUPP, as libibverbs does for rxe.
//! - `ibv_create_ah(3)`: RoCE needs a GRH: is_global 0 -> EINVAL, sgid_index beyond the
//!   table -> ENODATA (rxe S18).
//! - `ibv_dealloc_pd` EBUSY while MRs/QPs/SRQs/AHs use it; `ibv_destroy_cq` EBUSY while a
//!   QP uses it, and otherwise (as libibverbs' `ibv_destroy_cq(3)`) drops the channel events
//!   nobody has taken yet and blocks until every event handed out by `ibv_get_cq_event` was
//!   acknowledged with `ibv_ack_cq_events`; `ibv_destroy_srq` EBUSY while a QP uses it; `ibv_destroy_comp_channel`
//!   EBUSY while a CQ uses it (rxe S21, man pages). `ibv_close_device` with live objects
//!   returns 0 and keeps the context (memory and fds) alive so they stay usable and can
//!   still be destroyed; libibverbs does not check either.
//! - `ibv_destroy_qp` with work outstanding: no completions ever (rxe S21); completions of
//!   that QP still in its CQs are removed (as mlx5's CQ clean). QPNs are unique per process
//!   and never reused; QPs of all softnic contexts reach each other by QPN.
//!
//! ## QP state machine (`ibv_modify_qp(3)`, the kernel's `ib_modify_qp_is_ok`, rxe S20)
//! - RESET->INIT needs PKEY_INDEX|PORT|ACCESS_FLAGS (RC/UC) or PKEY_INDEX|PORT|QKEY (UD);
//!   INIT->RTR needs AV|PATH_MTU|DEST_QPN|RQ_PSN|MAX_DEST_RD_ATOMIC|MIN_RNR_TIMER (RC),
//!   AV|PATH_MTU|DEST_QPN|RQ_PSN (UC), nothing (UD); RTR->RTS needs
//!   SQ_PSN|TIMEOUT|RETRY_CNT|RNR_RETRY|MAX_QP_RD_ATOMIC (RC), SQ_PSN (UC/UD). A missing
//!   required attribute, or one the transition does not allow (e.g. QKEY on RC, TIMEOUT in
//!   RTS->RTS, ACCESS_FLAGS on UD) -> EINVAL, state unchanged.
//! - Allowed: RESET->RESET, INIT->INIT, RTS->RTS, INIT/RTR/RTS/ERR -> ERR and -> RESET.
//!   Invalid (EINVAL): RESET->RTR/RTS/ERR, INIT->RTS, RTR->RTR, RTS->INIT/RTR, ERR->INIT/RTS,
//!   any SQD/SQE transition (not modelled), a CUR_STATE that is not the current state.
//!   RESET->ERR is invalid as in the kernel table and rxe S20.
//! - Values: port_num must be 1; the AV must be global (RoCE), sgid_index beyond the table ->
//!   ENODATA; timeout > 31 and max_rd_atomic > 128 -> EINVAL (rxe S20).
//!   max_dest_rd_atomic, pkey_index, path_mtu, retry_cnt and rnr_retry are stored
//!   unvalidated (rxe S20 accepts max_dest_rd_atomic 200, pkey_index 100, path_mtu 4096,
//!   retry_cnt 8); rnr_retry >= 7 means "retry forever".
//! - `ibv_modify_qp` / `ibv_query_qp` with an attribute mask bit from `IBV_QP_RATE_LIMIT`
//!   on -> EOPNOTSUPP, as libibverbs' `ibv_cmd_modify_qp` / `ibv_cmd_query_qp` answer for
//!   rxe and mlx5 (those attributes need the extended command path).
//! - To RESET: queues emptied without completions (rxe S14), SQ accounting restarts.
//!   To ERR: receive queue flushed first, then waiting send WRs, all WR_FLUSH_ERR
//!   (rxe G8). `ibv_qp.state` always mirrors the state; `ibv_query_qp` reports it in both
//!   qp_state and cur_qp_state (rxe G10 reports cur_qp_state 0; the man page says current).
//!
//! ## Posting (`ibv_post_send(3)`, `ibv_post_recv(3)`)
//! - The chain is validated in order; the first rejected WR is returned in `*bad_wr` with its
//!   errno, WRs before it are posted, nothing from it on is (man). rxe returns bad_wr NULL
//!   and queues the WRs anyway when posting before RTS (S1); softnic follows the man page.
//! - post_send outside RTS (and ERR) -> EINVAL. post_recv in RESET -> EINVAL; in
//!   INIT/RTR/RTS the receive is queued (rxe S2). post_recv on a QP with an SRQ -> EINVAL
//!   (man: "you must use ibv_post_srq_recv()").
//! - In ERR, post_send returns 0 and the WR completes at once with WR_FLUSH_ERR, signaled or
//!   not (rxe G9, IBA). post_recv in ERR also flushes at once (IBA; rxe holds it until
//!   ERR->ERR, G9).
//! - SQ full -> ENOMEM, RQ/SRQ full -> ENOMEM (rxe S3/S4, mlx5). num_sge beyond the cap or
//!   negative -> EINVAL (rxe S4/S6). errno is not touched by a rejected post (rxe G1).
//! - SQ occupancy: a WR occupies a slot from its post until a completion of that WR or of a
//!   later WR of the same SQ (signaled success, error or flush) is *polled* — libmlx5
//!   reclaims SQ space in `poll_cq` the same way; rxe frees a slot on the ACK (S3). An
//!   unsignaled success never frees its slot by itself: a datapath that never signals (or
//!   never polls) fills the SQ and gets ENOMEM, so SQ accounting bugs show up on softnic.
//!   Completions polled after the QP was reset release nothing of the new incarnation.
//!   [`sq_outstanding`] reports the occupancy.
//! - Receives free their slot when consumed by an incoming message (rxe S4).
//! - IBV_SEND_INLINE on SEND/SEND_WITH_IMM/RDMA_WRITE/RDMA_WRITE_WITH_IMM copies the data at
//!   post time (man: "the data buffers can be reused immediately after the call returns"),
//!   into a buffer of the WR's queue entry (max_inline_data bytes, provisioned with the QP),
//!   before anything is written: a destination (remote range or receive buffer) that
//!   overlaps the inline sources gets the bytes they held at post, whether the WR runs at
//!   once or waits (RNR). SGEs of length 0 are not read, so `{addr: 0, length: 0}` is a
//!   valid empty inline message. More than max_inline_data bytes -> EINVAL with bad_wr at
//!   that WR, QP stays RTS (rxe S5). On READ/atomics the flag is ignored (man: inline is for SEND and RDMA
//!   WRITE; rxe S5 misapplies it).
//! - Atomics: remote_addr not 8-byte aligned, or not exactly one local SGE of >= 8 bytes ->
//!   EINVAL at post (rxe S10); on a device configured with `atomics: false` -> EINVAL.
//!   The 64-bit remote word is handled in host byte order, as rxe does; CAS/FAA are atomic
//!   against each other and return the original value into the local SGE.
//! - UD: a NULL AH -> EINVAL. Opcodes the QP type does not support (READ/atomics on UC,
//!   anything but SEND/SEND_WITH_IMM on UD, unknown opcodes) are accepted and complete with
//!   LOC_QP_OP_ERR, moving the QP to ERR (rxe S18/S21).
//!
//! ## Execution and completions
//! - Work runs synchronously inside post_send. Completions carry wr_id, qp_num, the opcode
//!   of the WR (for error and flush completions too; man `ibv_poll_cq(3)` only guarantees
//!   wr_id/status/qp_num/vendor_err there, rxe G2 puts 0), byte_len = the sum of the SGE
//!   lengths for every successful send-side opcode including atomics (rxe G6) and 0 on
//!   errors (G2), wc_flags WITH_IMM on SEND_WITH_IMM/RDMA_WRITE_WITH_IMM sender completions
//!   (rxe G5). Signaled = IBV_SEND_SIGNALED or sq_sig_all; an unsignaled success makes no
//!   CQE, errors and flushes always do (rxe G3).
//! - Receive completions: RECV (RECV_RDMA_WITH_IMM for WRITE_WITH_IMM, byte_len = the write
//!   length, receive buffer untouched: rxe S17), imm_data as posted (big-endian as the
//!   sender wrote it), WITH_IMM flag, src_qp = sender's QPN (on RC/UC too, where the man
//!   page calls it undefined), IBV_WC_GRH only on UD (man: "valid only for UD QPs"; rxe G4
//!   sets it on RC too).
//! - Zero-length SGEs and zero-byte WRITE/READ are not key-checked (rxe S16).
//! - Local errors: a bad lkey, an SGE outside its MR or an MR of another PD ->
//!   LOC_PROT_ERR (the manual; rxe S7 reports LOC_QP_OP_ERR for a gather-side bad lkey);
//!   READ/atomic results into an MR without LOCAL_WRITE -> LOC_PROT_ERR (rxe S8).
//! - Remote errors on RC: responder QP lacking REMOTE_WRITE/READ/ATOMIC in its access flags
//!   -> REM_INV_REQ_ERR (rxe S9/S10); bad rkey, range outside the MR, MR without the remote
//!   right -> REM_ACCESS_ERR (rxe S9/S10). Nothing is written. The responder goes to ERR
//!   too, its receives flushed (rxe S9), with IBV_EVENT_QP_REQ_ERR / QP_ACCESS_ERR (IBA;
//!   rxe raises none, G7). On UC the message is silently dropped and the sender succeeds.
//! - Receive buffer too small: the receive completes with LOC_LEN_ERR, the sender with
//!   REM_INV_REQ_ERR, both go to ERR, nothing is written (man/IBA; rxe S11 reports
//!   REM_OP_ERR/LOC_QP_OP_ERR and writes a prefix). A receive buffer in an MR without
//!   LOCAL_WRITE: LOC_PROT_ERR at the receiver, REM_OP_ERR at the sender (rxe S8).
//! - RNR (no receive posted for SEND/SEND_WITH_IMM/WRITE_WITH_IMM on RC): rnr_retry 7 ->
//!   the WR and everything posted after it on that SQ wait, and run when the responder
//!   posts a receive (rxe S12); rnr_retry < 7 -> RNR_RETRY_EXC_ERR at once (softnic does
//!   not model the RNR timer; rxe fails after the retries' delay), responder unaffected.
//!   UC/UD drop the message silently.
//! - A responder that does not exist or is not in RTR/RTS (destroyed, RESET, INIT, ERR):
//!   RC gets RETRY_EXC_ERR at once whatever retry_cnt (rxe S14/S21/S22 after the timeouts;
//!   with retry_cnt 7 rxe never completes — softnic does not hang). WRs waiting in RNR on a
//!   responder that leaves RTR/RTS or is destroyed also end with RETRY_EXC_ERR.
//! - After an error completion the QP is in ERR: the failing WR's completion first, then
//!   its receives flushed, then every send WR still waiting, signaled or not (rxe G8, S13).
//!   WRs that already executed (unsignaled successes) are not flushed, as on rxe (S13: the
//!   unsignaled successful #0 gets no completion) and mlx5: their slots are released by the
//!   next completion polled (the failing WR's), or — if the QP went to ERR by
//!   `ibv_modify_qp`/[`inject_qp_error`] with no later completion — only by a reset. A QP going to ERR through an error
//!   raises IBV_EVENT_QP_FATAL (IBA; rxe raises none, G7), and IBV_EVENT_QP_LAST_WQE_REACHED
//!   when it uses an SRQ.
//! - UD: AH + remote QPN + Q_Key (remote_qkey with the high bit set means the QP's own
//!   Q_Key, IBA; the Rxe profile sends it as it is, as rxe does, so it is dropped unless
//!   the target's Q_Key is that value); the AH's dgid must be a GID of the target's device;
//!   a wrong Q_Key, QPN, GID, non-UD target or a message larger than the 1024-byte path
//!   MTU is dropped and the sender succeeds (rxe S18). The receive gets a 40-byte GRH area:
//!   20 zero bytes then the IPv4 header of the RoCE v2 packet rxe would have received
//!   (total length 20 + 8 UDP + 12 BTH + 8 DETH, + 4 with immediate, + the payload padded
//!   to 4, + 4 ICRC; don't-fragment set; the checksum in Spec, 0 in Rxe as rxe0 writes), byte_len = 40 + payload, IBV_WC_GRH.
//!   A too-short UD receive completes with LOC_LEN_ERR, nothing written (Spec), or
//!   LOC_QP_OP_ERR with the GRH area written when it fits (Rxe, as rxe0 does), and that UD
//!   QP goes to ERR (rxe S18; the man page expects LOC_LEN_ERR).
//! - An RC WRITE_WITH_IMM the responder refuses for access: the requester gets
//!   REM_ACCESS_ERR; the responder's next receive is flushed with the rest (Spec) or, as
//!   rxe0 does, completed with REM_ACCESS_ERR itself before the rest are flushed (Rxe).
//! - Multicast: `ibv_attach_mcast` on UD QPs with a multicast GID (ff..), EINVAL otherwise;
//!   a UD send to a multicast dgid with remote_qpn 0xFFFFFF reaches every attached QP
//!   (whose Q_Key matches) except the sender. Detaching an unattached QP -> EINVAL.
//! - SRQ: receives are taken in posting order by any QP using it; `ibv_modify_srq` with
//!   IBV_SRQ_LIMIT arms the limit and IBV_EVENT_SRQ_LIMIT_REACHED fires once when the
//!   number of posted receives drops below it, disarming it (man ibv_modify_srq(3));
//!   IBV_SRQ_MAX_WR resizes (not below the current fill).
//! - CQ overflow: the completion that does not fit is lost, the CQ enters the error state
//!   and IBV_EVENT_CQ_ERR is raised (man ibv_create_cq(3)/IBA); from then on `poll_cq`
//!   returns `-EOVERFLOW` until the CQ is destroyed. rxe (S15) silently drops instead.
//! - Notification: `req_notify_cq` arms once; the next completion (with solicited_only,
//!   the next solicited or error completion) queues an event on the channel, whose fd is a
//!   pipe (epoll-able, blocking unless the application sets O_NONBLOCK).
//!   `ibv_get_async_event` likewise reads the context's `async_fd` pipe.
//! - Thread safety: every verb takes one process-wide mutex, so posting on one thread while
//!   another polls is correct; atomics from different QPs serialise on it too. `poll_cq` on
//!   an empty CQ takes no lock (an atomic fill count published with Release after each
//!   change), so a busy-polling thread does not slow the poster down.
//! - Limits of the model: no timers (RNR and transport retries resolve at once, see above),
//!   no SQD/SQE states, no memory windows, one port; QPNs are never reused, so a process
//!   can create about 2^24 QPs in its lifetime.
//!
//! ## Extended verbs
//! Every context is extended, as libibverbs makes them: the `ibv_context` is the last
//! field of a `verbs_context` (`abi_compat` = `__VERBS_ABI_IS_EXTENDED`, `sz` = the whole
//! struct) whose `query_device_ex`, `create_qp_ex`, `create_cq_ex`, `alloc_td`,
//! `dealloc_td`, `alloc_parent_domain` and `query_rt_values` are softnic's, so the verbs.h
//! inlines (`hotverbs_ffi::inline::ibv_create_qp_ex`, ...) reach them as they reach a
//! provider; every other extended op is NULL (the header answers EOPNOTSUPP/ENOSYS).
//! - `ibv_query_device_ex(3)`: `orig_attr` as `ibv_query_device`, `completion_timestamp_mask`
//!   all ones and `hca_core_clock` [`HCA_CORE_CLOCK_KHZ`] (Rxe: 0 and 0),
//!   `device_cap_flags_ex` = the legacy flags, `phys_port_cnt_ex` 1, the rest 0; at most
//!   `attr_size` bytes are written.
//! - `ibv_create_qp_ex(3)`: `comp_mask` may hold PD (required: EINVAL without it),
//!   CREATE_FLAGS (any flag -> EOPNOTSUPP, as rxe) and SEND_OPS_FLAGS; any other bit ->
//!   EOPNOTSUPP (rxe's `check_qp_init_attr`). The QP is created exactly as by
//!   `ibv_create_qp` (same limits, same returned `cap`). `send_ops_flags` may name SEND,
//!   SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM on RC/UC/UD as the transport allows
//!   (UD: the two SENDs), RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD on RC;
//!   anything else (SEND_WITH_INV, LOCAL_INV, BIND_MW, TSO, FLUSH, ATOMIC_WRITE: softnic has
//!   no memory windows or those opcodes; rxe accepts some of them) -> EOPNOTSUPP. The QP's
//!   `ibv_qp_ex` (`ibv_qp_to_qp_ex`; its `qp_base` is the QP) has `wr_start`,
//!   `wr_complete`, `wr_abort`, `wr_set_sge`, `wr_set_sge_list`, `wr_set_inline_data`,
//!   `wr_set_inline_data_list`, `wr_set_ud_addr` and exactly the requested opcode builders;
//!   the others are NULL. `ibv_qp_to_qp_ex` of a QP made by `ibv_create_qp` is NULL (errno
//!   untouched), as libibverbs answers for a QP without `VERBS_QP_EX`.
//! - `ibv_wr_post(3)`: `qpx->wr_id` and `qpx->wr_flags` are read when an opcode builder is
//!   called; the setters act on the WR built last (a setter before any opcode: EINVAL at
//!   `wr_complete`); `wr_set_sge` with length 0 sets no SGE (as rxe and mlx5); inline data
//!   is copied at the setter call, and only on a SEND or RDMA_WRITE (the man page's "valid
//!   only for"; other opcodes: EINVAL at `wr_complete`). IBV_SEND_INLINE is not one of the
//!   man page's `wr_flags`: a WR whose data was set by `wr_set_sge(_list)` is gathered from
//!   its SGEs whatever the flag says (as mlx5; rxe's behaviour there was not measured).
//!   Builders stage the WRs in storage provisioned at creation (one entry per SQ slot up to
//!   4096, each with room for `max_send_sge` SGEs and `max_inline_data` bytes): the batch
//!   allocates nothing. `wr_complete` posts the batch all or nothing: a builder limit
//!   (above) or a WR `ibv_post_send` would refuse (QP state, SQ room for the whole batch,
//!   SGE count, inline size, atomic alignment, UD without an AH: EINVAL) returns that errno
//!   and posts none of it, as rxe's and mlx5's rollback; otherwise the WRs go through the
//!   `ibv_post_send` engine in order, so every behaviour above (errors, profiles, flushes,
//!   RNR, inline limits, selective signaling) applies and their completions are those of
//!   posted WRs. `wr_abort` discards the batch; after a `wr_complete` (which ends the
//!   batch, posted or refused) `wr_abort` does nothing and another `wr_complete` returns
//!   EINVAL. `wr_start` .. `wr_complete`/`wr_abort` hold a per-QP builder lock (a spin
//!   lock, as rxe's `sq.lock`), except on a QP created on a parent domain with a thread
//!   domain, whose application promises a single thread (`ibv_alloc_td(3)`): no lock there.
//!   An inline WR travels as one SGE, so a QP created with `max_send_sge` 0 cannot post one
//!   (EINVAL at `wr_complete`).
//! - `ibv_create_cq_ex(3)`: `wc_flags` may hold BYTE_LEN, IMM, QP_NUM, SRC_QP, SLID, SL,
//!   DLID_PATH_BITS, COMPLETION_TIMESTAMP and COMPLETION_TIMESTAMP_WALLCLOCK (Rxe: not the
//!   two timestamps); CVLAN, FLOW_TAG, TM_INFO or unknown bits -> EOPNOTSUPP. `comp_mask`
//!   may hold FLAGS (only IBV_CREATE_CQ_ATTR_SINGLE_THREADED; others EOPNOTSUPP) and PD
//!   (`parent_domain` must be a parent domain: EINVAL otherwise; it stays busy until the CQ
//!   is destroyed); other bits -> EOPNOTSUPP (libibverbs' `ibv_cmd_create_cq_ex`). `cqe`,
//!   channel and `comp_vector` as `ibv_create_cq`. The `ibv_cq_ex` has `start_poll`,
//!   `next_poll`, `end_poll`, `read_opcode`, `read_vendor_err`, `read_wc_flags` and exactly
//!   the readers of the requested flags. `start_poll`/`next_poll` return 0 with
//!   `cq->wr_id`/`cq->status` set, ENOENT when empty (no lock taken then, as `poll_cq`),
//!   EOVERFLOW after an overflow (Spec, S15); they release SQ slots as `poll_cq` does. The
//!   CQ is also a plain `ibv_cq` (`ibv_cq_ex_to_cq`): `ibv_poll_cq`, notification, resize
//!   and QPs all work on it.
//! - Completion timestamps (Spec): taken when the completion is generated, and only on a
//!   CQ that asked for one. Raw values count HCA cycles of a free-running clock:
//!   `CLOCK_MONOTONIC` at [`HCA_CORE_CLOCK_KHZ`] (156.25 MHz), so
//!   `ns = raw * 1_000_000 / hca_core_clock`. `read_completion_wallclock_ns` is
//!   `CLOCK_REALTIME` in ns. `ibv_query_rt_values_ex(3)` with IBV_VALUES_MASK_RAW_CLOCK
//!   returns the raw clock now, in `raw_clock.tv_nsec` with `tv_sec` 0 (as mlx5), and sets
//!   `comp_mask` to the fields it filled.
//! - Thread domains (`ibv_alloc_td(3)`): `comp_mask` must be 0 (EINVAL); `ibv_dealloc_td`
//!   EBUSY while a parent domain uses it. Parent domains (`ibv_alloc_parent_domain(3)`):
//!   `pd` required and not itself a parent domain (EINVAL), `td` optional,
//!   PD_CONTEXT accepted, ALLOCATORS -> EOPNOTSUPP (softnic provisions its own queues). The
//!   result is an `ibv_pd` usable wherever a PD is (MRs, AHs, SRQs, `create_qp_ex` with
//!   IBV_QP_INIT_ATTR_PD, `create_cq_ex` with IBV_CQ_INIT_ATTR_MASK_PD) and shares its
//!   PD's protection domain (its MRs serve QPs of the PD and vice versa, as on mlx5). It
//!   keeps its PD and thread domain busy (EBUSY) and is freed by `ibv_dealloc_pd` (EBUSY
//!   while objects use it). All of this answers EOPNOTSUPP in the Rxe profile (table).
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]
#![deny(missing_docs)]

pub mod counting;
mod errno;
mod ex;
mod fabric;
mod mem;
pub mod mlx5sim;
mod strings;
pub mod testing;
mod verbs;

pub use ex::HCA_CORE_CLOCK_KHZ;
use hotverbs_ffi::{ibv_context, ibv_cq, ibv_qp, ibv_srq, IbvFns};

/// Attributes of a softnic device; `Default` is close to rxe (`ibv_devinfo -v` on rxe0).
#[derive(Clone, Debug)]
pub struct Config {
    /// Device name (`ibv_get_device_name`).
    pub name: String,
    /// Maximum `max_send_wr` / `max_recv_wr` of a QP.
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum CQ size.
    pub max_cqe: u32,
    /// Maximum `max_inline_data` of a QP.
    pub max_inline_data: u32,
    /// Maximum number of QPs of a context.
    pub max_qp: u32,
    /// Maximum `max_wr` of an SRQ.
    pub max_srq_wr: u32,
    /// Maximum `max_sge` of an SRQ.
    pub max_srq_sge: u32,
    /// Maximum outstanding RDMA READ / atomic (reported; bounds `max_rd_atomic`).
    pub max_qp_rd_atom: u32,
    /// Whether atomics are supported (`atomic_cap` ATOMIC_HCA, else ATOMIC_NONE and atomic
    /// WRs are rejected with EINVAL).
    pub atomics: bool,
    /// Reported `max_cq`.
    pub max_cq: u32,
    /// Reported `max_mr`.
    pub max_mr: u32,
    /// Reported `max_pd`.
    pub max_pd: u32,
    /// Reported `max_ah`.
    pub max_ah: u32,
    /// Reported `max_srq`.
    pub max_srq: u32,
    /// `ibv_context.num_comp_vectors` (create_cq's comp_vector must be below it).
    pub num_comp_vectors: u32,
    /// Whether `ibv_reg_dmabuf_mr` is supported; `false` answers `EOPNOTSUPP`, as
    /// libibverbs does for a provider without it (rxe).
    pub dmabuf: bool,
    /// IPv4 address in the device's RoCE v2 GID (index 1); `None` picks `10.77.x.y` from the
    /// device number (the default device is 10.77.0.1).
    pub ipv4: Option<[u8; 4]>,
    /// Which behaviour the device follows where rxe departs from the man pages (see
    /// "Profiles" in the crate docs). `Default` reads `HOTVERBS_SOFTNIC_PROFILE`
    /// ([`Profile::from_env`]).
    pub profile: Profile,
    /// The mlx5 personality: [`mlx5dv_init_obj`] describes the device's QPs, CQs and AHs
    /// as libmlx5 would, and a simulated ConnectX executes the WQEs written into those
    /// send queues ([`mlx5_step`]), so the mlx5 direct path runs without a ConnectX. Off
    /// by default.
    pub mlx5: bool,
    /// Bytes per CQE of the mlx5 personality's CQs as `mlx5dv_init_obj(3)` describes them:
    /// 64 (the default) or 128, what libmlx5 makes with `MLX5_CQE_SIZE=128` (the 64-byte
    /// CQE's fields in the second half of each). A device setting rather than that
    /// environment variable, so tests in one process choose it per device without racing.
    /// Any other value: `mlx5dv_init_obj` of a CQ fails with `EINVAL`.
    pub mlx5_cqe_size: u32,
    /// The mlx5 personality behaves as libmlx5 with `MLX5_SHUT_UP_BF=1`: QPs outside a
    /// thread domain get a register without BlueFlame (`bf.size` 0, libmlx5's non-cached
    /// UAR), a thread domain's register keeps its BlueFlame buffers (libmlx5's
    /// `mlx5_attach_dedicated_uar` ignores the variable) but libmlx5's own posts never
    /// copy to them, and [`mlx5_shut_up_bf`] says so. A device setting rather than the
    /// environment variable, so tests in one process choose it per device without racing.
    pub mlx5_shut_up_bf: bool,
}

/// The behaviour profile of a softnic device: the man pages, or rxe as measured
/// (`shared/rxe-vm/fault-truth.md`). The table under "Profiles" in the crate docs lists
/// every difference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Profile {
    /// The man pages and the IBA (softnic's original behaviour).
    #[default]
    Spec,
    /// Every departure of rdma_rxe (Linux 6.1, rdma-core 44) that softnic can model.
    Rxe,
}

/// The environment variable [`Profile::from_env`] reads.
pub const PROFILE_ENV: &str = "HOTVERBS_SOFTNIC_PROFILE";

impl Profile {
    /// The profile named by `HOTVERBS_SOFTNIC_PROFILE`: `spec` or `rxe` (any case). Unset
    /// or empty means [`Profile::Spec`]; any other value also means `Spec`, with a warning
    /// on stderr (printed once per process). Never panics.
    pub fn from_env() -> Profile {
        match std::env::var_os(PROFILE_ENV) {
            None => Profile::Spec,
            Some(v) => Profile::parse(v.to_str().unwrap_or("\u{fffd}")).unwrap_or_else(|| {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    eprintln!(
                        "hotverbs-softnic: {PROFILE_ENV}={v:?} is neither \"spec\" nor \"rxe\"; using spec"
                    );
                });
                Profile::Spec
            }),
        }
    }

    /// `spec` / `rxe` in any case (and the empty string as `Spec`); `None` otherwise.
    pub fn parse(name: &str) -> Option<Profile> {
        let n = name.trim();
        if n.is_empty() || n.eq_ignore_ascii_case("spec") {
            Some(Profile::Spec)
        } else if n.eq_ignore_ascii_case("rxe") {
            Some(Profile::Rxe)
        } else {
            None
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "softnic".to_string(),
            max_qp_wr: 1_048_576,
            max_sge: 32,
            max_cqe: 32767,
            max_inline_data: 512,
            max_qp: 1_048_560,
            max_srq_wr: 1_048_576,
            max_srq_sge: 27,
            max_qp_rd_atom: 128,
            atomics: true,
            max_cq: 1_048_576,
            max_mr: 524_287,
            max_pd: 1_048_576,
            max_ah: 32767,
            max_srq: 917_503,
            num_comp_vectors: 1,
            dmabuf: true,
            ipv4: None,
            profile: Profile::from_env(),
            mlx5: false,
            mlx5_cqe_size: 64,
            mlx5_shut_up_bf: false,
        }
    }
}

static TABLE: IbvFns = IbvFns {
    _ibv_query_gid_ex: Some(verbs::query_gid_ex),
    ibv_ack_async_event: Some(verbs::ack_async_event),
    ibv_ack_cq_events: Some(verbs::ack_cq_events),
    ibv_alloc_pd: Some(verbs::alloc_pd),
    ibv_attach_mcast: Some(verbs::attach_mcast),
    ibv_close_device: Some(verbs::close_device),
    ibv_create_ah: Some(verbs::create_ah),
    ibv_create_ah_from_wc: Some(verbs::create_ah_from_wc),
    ibv_create_comp_channel: Some(verbs::create_comp_channel),
    ibv_create_cq: Some(verbs::create_cq),
    ibv_create_qp: Some(verbs::create_qp),
    ibv_create_srq: Some(verbs::create_srq),
    ibv_dealloc_pd: Some(verbs::dealloc_pd),
    ibv_dereg_mr: Some(verbs::dereg_mr),
    ibv_destroy_ah: Some(verbs::destroy_ah),
    ibv_destroy_comp_channel: Some(verbs::destroy_comp_channel),
    ibv_destroy_cq: Some(verbs::destroy_cq),
    ibv_destroy_qp: Some(verbs::destroy_qp),
    ibv_destroy_srq: Some(verbs::destroy_srq),
    ibv_detach_mcast: Some(verbs::detach_mcast),
    ibv_event_type_str: Some(strings::event_type_str),
    ibv_free_device_list: Some(verbs::free_device_list),
    ibv_get_async_event: Some(verbs::get_async_event),
    ibv_get_cq_event: Some(verbs::get_cq_event),
    ibv_get_device_guid: Some(verbs::get_device_guid),
    ibv_get_device_list: Some(verbs::get_device_list),
    ibv_get_device_name: Some(verbs::get_device_name),
    ibv_init_ah_from_wc: Some(verbs::init_ah_from_wc),
    ibv_modify_qp: Some(verbs::modify_qp),
    ibv_modify_srq: Some(verbs::modify_srq),
    ibv_open_device: Some(verbs::open_device_c),
    ibv_node_type_str: Some(strings::node_type_str),
    ibv_port_state_str: Some(strings::port_state_str),
    ibv_query_device: Some(verbs::query_device),
    ibv_query_gid: Some(verbs::query_gid),
    ibv_query_pkey: Some(verbs::query_pkey),
    ibv_query_port: Some(verbs::query_port),
    ibv_query_qp: Some(verbs::query_qp),
    ibv_query_srq: Some(verbs::query_srq),
    ibv_qp_to_qp_ex: Some(ex::qp_to_qp_ex),
    ibv_reg_dmabuf_mr: Some(verbs::reg_dmabuf_mr),
    ibv_reg_mr: Some(verbs::reg_mr),
    ibv_reg_mr_iova: Some(verbs::reg_mr_iova),
    ibv_reg_mr_iova2: Some(verbs::reg_mr_iova2),
    ibv_resize_cq: Some(verbs::resize_cq),
    ibv_wc_status_str: Some(strings::wc_status_str),
    ..IbvFns::EMPTY
};

/// softnic's verbs as the function table libibverbs is loaded into: every setup verb the
/// hotverbs layer uses, with libibverbs' conventions (NULL + errno, or an errno value).
/// Objects of any softnic context ([`open_device`] ones included) are accepted by every
/// entry.
pub fn verbs_table() -> &'static IbvFns {
    &TABLE
}

/// Opens a context on a new device with `config`'s attributes (not listed by
/// `ibv_get_device_list`). Close it with the table's `ibv_close_device`. Returns NULL and
/// sets errno if no file descriptor is available for its async event pipe.
pub fn open_device(config: Config) -> *mut ibv_context {
    let mut f = fabric::lock();
    // The default device is registered first, whichever comes first: `ibv_get_device_list`
    // or this. Its address follows from its index in the fabric, so it is device 0 (GID
    // 10.77.0.1) in every process, and a custom device never takes that address.
    verbs::default_device(&mut f);
    let d = verbs::add_device(&mut f, config, true);
    verbs::new_context(&mut f, d)
}

/// Whether `ctx`'s device has the mlx5 personality ([`Config::mlx5`]).
///
/// # Safety
/// `ctx` is a live context opened through [`verbs_table`] or [`open_device`].
pub unsafe fn is_mlx5(ctx: *mut ibv_context) -> bool {
    let f = fabric::lock();
    // SAFETY: a live softnic context (caller).
    let ci = unsafe { verbs::ctx_idx(ctx) };
    f.dv_ctx(ci)
}

/// Whether `ctx`'s mlx5 personality stands for libmlx5 under `MLX5_SHUT_UP_BF`
/// ([`Config::mlx5_shut_up_bf`]).
///
/// # Safety
/// `ctx` is a live context opened through [`verbs_table`] or [`open_device`].
pub unsafe fn mlx5_shut_up_bf(ctx: *mut ibv_context) -> bool {
    let f = fabric::lock();
    // SAFETY: a live softnic context (caller).
    let ci = unsafe { verbs::ctx_idx(ctx) };
    let c = f.cfg(ci);
    c.mlx5 && c.mlx5_shut_up_bf
}

/// `mlx5dv_init_obj(3)` on a device with the mlx5 personality ([`Config::mlx5`]): fills
/// the `out` structs of the kinds in `kind` (`MLX5DV_OBJ_QP`, `_CQ`, `_AH`; others are
/// `EOPNOTSUPP`) with the simulated send queue, CQ buffer and address vector, made at the
/// first call for each object. From then on the QP's WQEs are read from its send queue and
/// the CQ's completions are written to its buffer as mlx5 CQEs. Returns 0 or an errno
/// (`EOPNOTSUPP` on a device without the personality).
///
/// # Safety
/// `obj`'s `in` fields of those kinds are live objects of a softnic context and its `out`
/// pointers writable.
pub unsafe fn mlx5dv_init_obj(obj: *mut hotverbs_ffi::mlx5dv::mlx5dv_obj, kind: u64) -> i32 {
    let mut f = fabric::lock();
    // SAFETY: a valid object description (caller).
    let obj = unsafe { &mut *obj };
    let ctx = if kind & u64::from(hotverbs_ffi::mlx5dv::MLX5DV_OBJ_QP) != 0 {
        // SAFETY: a live QP (caller).
        unsafe { (*obj.qp.in_).context }
    } else if kind & u64::from(hotverbs_ffi::mlx5dv::MLX5DV_OBJ_CQ) != 0 {
        // SAFETY: a live CQ (caller).
        unsafe { (*obj.cq.in_).context }
    } else if kind & u64::from(hotverbs_ffi::mlx5dv::MLX5DV_OBJ_AH) != 0 {
        // SAFETY: a live AH (caller).
        unsafe { (*obj.ah.in_).context }
    } else if kind & u64::from(hotverbs_ffi::mlx5dv::MLX5DV_OBJ_SRQ) != 0 {
        // SAFETY: a live SRQ (caller).
        unsafe { (*obj.srq.in_).context }
    } else {
        return libc::EOPNOTSUPP;
    };
    // SAFETY: a live softnic context.
    if !f.dv_ctx(unsafe { verbs::ctx_idx(ctx) }) {
        return libc::EOPNOTSUPP;
    }
    // SAFETY: forwarded contract.
    unsafe { f.dv_init_obj(obj, kind) }
}

/// Runs the mlx5 personality's simulated device once: every WQE announced by a send
/// queue's doorbell record since the last run is executed (data moves, completions are
/// written as CQEs), then armed CQs with a new CQE get their event. Returns how many WQEs
/// it read. `ibv_poll_cq` on any softnic CQ, and the setup layer's direct poller, run it
/// too; a test calls it to let the device work without polling.
pub fn mlx5_step() -> u32 {
    fabric::lock().dv_step()
}

/// Whether the mlx5 personality's simulated device has queues to run (a QP handed out by
/// [`mlx5dv_init_obj`]). A thread waiting on a softnic completion channel then runs
/// the device while it waits ([`wait_fd_stepping`]), as a ConnectX runs on its own.
pub fn mlx5_active() -> bool {
    fabric::DV_QPS.load(core::sync::atomic::Ordering::Relaxed) != 0
}

/// Waits up to `timeout` (`None`: for ever) for `fd` (a softnic channel's) to become
/// readable, running the simulated ConnectX ([`mlx5_step`]) every millisecond meanwhile,
/// so WQEs written straight into a send queue complete and raise their events with nobody
/// polling. `Ok(true)`: readable; `Ok(false)`: the timeout passed, or no simulated queue
/// is left (then the caller waits as usual). A blocking `ibv_get_cq_event` on a softnic
/// channel waits this way; so does `hotverbs::CompChannel::wait_cq_event`. A thread that
/// waits on the fd by itself (`epoll`) still needs someone to poll or step.
pub fn wait_fd_stepping(fd: i32, timeout: Option<std::time::Duration>) -> std::io::Result<bool> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        mlx5_step();
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let slice = left.map_or(1, |l| l.as_millis().min(1) as i32);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, slice) };
        if n > 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if left.is_some_and(|l| l.is_zero()) || !mlx5_active() {
            return Ok(false);
        }
    }
}

/// Moves `qp` to ERR as a fatal error would: its receives and waiting send WRs complete
/// with `IBV_WC_WR_FLUSH_ERR` and `IBV_EVENT_QP_FATAL` is raised on its context (Spec
/// profile; the Rxe profile raises no event, rxe G7). A QP already in ERR is left alone.
///
/// # Safety
/// `qp` is a live QP created through [`verbs_table`].
pub unsafe fn inject_qp_error(qp: *mut ibv_qp) {
    // SAFETY: a live softnic QP (caller).
    verbs::inject_error(unsafe { (*qp).handle } as usize);
}

/// Number of SQ slots `qp` currently occupies (posted WRs whose slot was not yet released
/// by a completion of them or of a later WR). For tests of SQ accounting.
///
/// # Safety
/// `qp` is a live QP created through [`verbs_table`].
pub unsafe fn sq_outstanding(qp: *mut ibv_qp) -> u32 {
    let mut f = fabric::lock();
    // SAFETY: a live softnic QP (caller).
    let q = f.qp(unsafe { (*qp).handle } as usize);
    (q.sq_posted - q.sq_released) as u32
}

/// Number of receives posted to `qp`'s own receive queue and not yet consumed by a
/// message or a flush (0 for a QP that uses an SRQ). In the Rxe profile this includes
/// receives posted in ERR, which wait for the next ERR->ERR (rxe G9).
///
/// # Safety
/// `qp` is a live QP created through [`verbs_table`].
pub unsafe fn rq_outstanding(qp: *mut ibv_qp) -> u32 {
    let mut f = fabric::lock();
    // SAFETY: a live softnic QP (caller).
    f.qp(unsafe { (*qp).handle } as usize).rq.q.len() as u32
}

/// Number of receives posted to `srq` and not yet consumed.
///
/// # Safety
/// `srq` is a live SRQ created through [`verbs_table`].
pub unsafe fn srq_outstanding(srq: *mut ibv_srq) -> u32 {
    let f = fabric::lock();
    // SAFETY: a live softnic SRQ (caller).
    let i = unsafe { (*srq).handle } as usize;
    f.srqs
        .get(i)
        .and_then(|s| s.as_ref())
        .map_or(0, |s| s.rq.q.len() as u32)
}

/// The profile of the device `ctx` was opened on: tests use it to expect exactly the
/// measured behaviour of that profile.
///
/// # Safety
/// `ctx` is a live context opened through [`verbs_table`] or [`open_device`].
pub unsafe fn device_profile(ctx: *mut ibv_context) -> Profile {
    let f = fabric::lock();
    // SAFETY: a live softnic context (caller).
    f.cfg(unsafe { verbs::ctx_idx(ctx) }).profile
}

/// Test hook: the next `n` completions pushed to `cq` overflow it, whatever its fill. In
/// the Spec profile the first one puts the CQ in the error state as a real overflow does
/// (`poll_cq` returns `-EOVERFLOW` from then on; `IBV_EVENT_CQ_ERR`); in the Rxe profile
/// each is dropped with an `IBV_EVENT_CQ_ERR` and the CQ stays usable, and a dropped
/// receive completion moves the responder QP to ERR (rxe S15). `n = 0` cancels.
///
/// # Safety
/// `cq` is a live CQ created through [`verbs_table`].
pub unsafe fn inject_cq_overflow(cq: *mut ibv_cq, n: u32) {
    let mut f = fabric::lock();
    // SAFETY: a live softnic CQ (caller).
    let i = unsafe { (*cq).handle } as usize;
    if let Some(Some(c)) = f.cqs.get_mut(i) {
        c.inject_overflow = n;
        c.set_limit();
    }
}

/// Number of send WRs of `qp` waiting to execute: RNR wait with `rnr_retry` 7, and in the
/// Rxe profile WRs queued before RTS (rxe S1) or held by an endless transport retry (G11).
///
/// # Safety
/// `qp` is a live QP created through [`verbs_table`].
pub unsafe fn send_wrs_waiting(qp: *mut ibv_qp) -> usize {
    let mut f = fabric::lock();
    // SAFETY: a live softnic QP (caller).
    f.qp(unsafe { (*qp).handle } as usize).pending_len()
}
