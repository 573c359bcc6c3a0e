//! `cargo xtask miri`: the soundness tests under miri (nightly), Stacked Borrows and, for the
//! ring and memory-access tests, Tree Borrows too.
//!
//! A whole test target takes far longer under miri than this step may (20+ minutes for one
//! of the datapath's), so the tests are chosen: [`MIRI_TESTS`] is the one list, and each
//! entry says which soundness property it keeps closed. The step installs what it needs
//! (the nightly toolchain with its `miri` and `rust-src` components) the way the other steps
//! install theirs.
//!
//! Flags: softnic and the setup layer read the clock (`Instant`, timeouts), which miri's
//! isolation forbids, hence `-Zmiri-disable-isolation`. `-Zmiri-permissive-provenance` is
//! not used: the verbs ABI carries buffer addresses as `u64` (`ibv_sge.addr`,
//! `remote_addr`), so softnic turns integers back into pointers, which is exposed
//! provenance; miri accepts it and prints a warning once per place.

use std::process::Command;
use std::time::Instant;

use crate::util::{root, run, show};

/// Which aliasing model(s) a test runs under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Models {
    /// Stacked Borrows only (miri's default).
    Stacked,
    /// Stacked Borrows, then Tree Borrows.
    Both,
}

/// One selected test: package, test target, exact test names, models, and what it keeps
/// closed (soundness review items, see docs/verification.md#soundness).
struct MiriTest {
    package: &'static str,
    target: &'static str,
    tests: &'static [&'static str],
    models: Models,
    why: &'static str,
}

/// The tests `cargo xtask miri` runs: the one place the list lives.
const MIRI_TESTS: &[MiriTest] = &[
    MiriTest {
        package: "hotverbs-datapath",
        target: "chain_alias",
        tests: &[
            "chained_posts_on_a_stack_ring",
            "chained_posts_on_a_boxed_ring",
            "flush_signaled_chain",
        ],
        models: Models::Both,
        why: "item 5: the send ring's preformatted chain stays valid across posts and moves",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "counting",
        tests: &[
            "batching_sizes_1_to_n",
            "ring_moved_between_stage_and_flush_relinks",
            "recv_ring_on_rq",
            "recv_ring_on_srq",
            "fence_and_solicited_reach_send_flags_of_their_wr_only",
        ],
        models: Models::Both,
        why: "items 5, 8: send and receive rings on the counting device (provenance kept)",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "regressions",
        tests: &[
            "recv_ring_refuses_a_send_completion_with_its_ring_id",
            "recv_ring_consumes_the_completion_it_accepts",
            "rings_refuse_completions_of_another_qp",
            "split_completion_before_sync_is_not_dropped",
            "split_error_completion_before_sync_is_published",
            "a_new_split_retires_the_old_counters",
            "unsplit_takes_only_the_latest_pair_and_ends_split_mode",
        ],
        models: Models::Stacked,
        why: "items 3, 4: foreign completions and counters; split mode",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "lib",
        tests: &[
            "send::tests::completions_across_the_wr_id_epoch_retire_their_wrs",
            "wr::tests::completions_across_the_wr_id_epoch_retire_their_wrs",
        ],
        models: Models::Stacked,
        why: "issue 27: SendRing and WrRing completions decided on the fast path (wr_id - \
              id_off) and out of line (the previous 2^55 epoch, stale), on the counting \
              device",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "wr_ring",
        tests: &[
            "batch_posts_one_region_and_signals_on_schedule",
            "poller_reads_requested_fields_and_timestamps",
            "every_opcode_builds_with_its_flags",
            "softnic_writes_reads_and_atomics_through_the_wr_api",
            "cached_functions_move_with_rings_and_pollers_through_swap_forget_and_a_panic",
        ],
        models: Models::Both,
        why: "issue 27 item 5: ExCqPoller's field reads write through the slot they took (no \
              &mut self retag between); WrRing's builders and inline payloads (wr.rs), on the \
              counting device and softnic; the QP and CQ functions both read once, through \
              swap, forget and a panic",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "regressions",
        tests: &[
            "a_receive_completion_handed_to_a_send_ring_is_an_error_naming_its_ring",
            "every_send_ring_refuses_what_is_not_its_own_and_ignores_its_stale",
            "recv_ring_refuses_another_receive_rings_completion_and_keeps_stale_for_its_own",
            "a_completion_without_its_qp_number_is_refused_naming_the_missing_field",
        ],
        models: Models::Stacked,
        why: "issue 27 item 10: a completion that is not a ring's is an error (Misrouted), a \
              stale one of its own is ignored; every ring kind and the retirer",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "regressions",
        tests: &[
            "completions_after_a_panicking_drain_closure_come_back_on_the_next_poll",
            "a_drain_rest_moves_with_its_poller_through_swap",
        ],
        models: Models::Stacked,
        why: "issue 27 (suspected, settled): CqPoller::drain keeps what a panicking closure \
              was not handed (unwinding through the drain guard)",
    },
    MiriTest {
        package: "hotverbs-softnic",
        target: "soundness",
        tests: &[
            "destroy_cq_waits_for_taken_events_to_be_acknowledged",
            "destroy_cq_drops_events_nobody_took",
            "counting_device_callbacks_keep_provenance_over_the_device",
            "device_copies_into_application_memory",
            "device_partial_word_writes_meet_the_application_with_its_unit",
        ],
        models: Models::Both,
        why: "items 6, 7, 8: CQ destroy vs events, counting-device provenance, softnic's copies",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "direct",
        tests: &[
            "lone_inline_send_is_libmlx5s_wqe_and_a_blueflame_copy",
            "inline_data_wraps_at_the_end_of_the_sq",
            "an_error_completion_retires_exactly_and_flushes_the_rest",
            "a_leaked_batch_is_never_announced_and_its_blocks_are_reused",
            "owner_bit_wraps_over_many_passes",
            "mixed_qps_and_opcodes_in_one_poll_across_the_cq_wrap",
            "a_batch_leaked_after_a_mid_batch_signal_is_never_announced",
            "clean_after_a_reset_removes_that_qps_stale_cqes_and_nothing_else",
            "clean_walks_a_completely_full_cq",
            "a_leaked_batch_rewinds_to_the_doorbell_across_its_16_bit_wrap",
            "fence_and_solicited_are_the_ctrl_bits_of_their_message_only",
            "a_uc_ring_posts_send_and_write_and_refuses_read_and_atomics",
            "cqes_of_128_bytes_are_read_from_their_second_half",
            "the_hardware_doorbell_is_there_only_where_its_barriers_are",
        ],
        models: Models::Both,
        why:
            "the mlx5 direct path: WQE stores, the BlueFlame copy and CQE reads on raw SQ/CQ memory",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "direct_session",
        tests: &[
            "a_session_writes_what_send_now_writes_and_retires_everything_once",
            "a_window_writes_what_a_batch_writes",
            "a_leaked_session_is_caught_up_from_the_doorbell_record",
            "a_completion_for_a_leaked_sessions_wr_is_not_lost",
            "a_leaked_window_announces_nothing",
            "a_post_list_writes_what_a_window_writes_across_the_sq_wrap",
            "sessions_swapped_between_rings_stay_with_their_rings",
            "a_panic_with_a_window_or_session_open_leaves_the_ring_consistent",
            "error_completions_of_unsignaled_session_wrs_name_their_wrs",
            "error_completions_of_a_lone_runs_wrs_name_their_wrs",
            "every_other_call_ends_a_lone_run",
            "lone_runs_survive_swap_and_a_panic",
        ],
        models: Models::Stacked,
        why: "issue 29: the fixed-size session, window and post list write WQEs through raw \
              SQ pointers and catch a leaked session up from the doorbell record; the \
              session's late `wrid` entries, read again at an error CQE's `wqe_counter`; \
              `send_now`'s lone runs, which read `cur_post` from the doorbell record (or a \
              static while closed) and end at any other call",
    },
    MiriTest {
        package: "hotverbs",
        target: "real_device_departures",
        tests: &[
            "d2_refused_write_with_imm_and_the_responders_receive",
            "d4_a_ud_receive_too_short_for_the_payload",
        ],
        models: Models::Both,
        why: "issue 31 D2/D4: softnic completes a receive it takes back for a refused \
              WRITE_WITH_IMM, and scatters the GRH area into a receive too short for the rest",
    },
    MiriTest {
        package: "hotverbs",
        target: "real_device_chains",
        tests: &[
            "a_chain_runs_in_order_with_one_call",
            "the_refused_wr_is_named_and_the_ones_before_it_run",
        ],
        models: Models::Both,
        why: "Qp::post_send_chain links the chain's ibv_send_wrs by raw pointers into one \
              Vec and maps bad_wr back to an index",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "mlx5_recv_session",
        tests: &[
            "a_session_hands_out_payloads_where_they_are_and_reposts_by_the_counter",
            "fewer_slots_than_wqes_rewrite_the_head_wqe",
            "the_general_path_routes_copies_and_fails",
            "a_session_needs_the_poller_serving_its_queue",
            "sessions_survive_swap_forget_and_panic",
            "a_session_after_a_leaked_one_catches_up_the_counter",
        ],
        models: Models::Both,
        why: "issue 30: RecvSession hands out slices of the CQ and the slots, reads the \
              wrid table and writes WQEs and doorbell records through raw pointers",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "mlx5_srq",
        tests: &[
            "the_free_list_takes_back_freed_wqes_in_libmlx5s_order",
            "swapped_srqs_post_into_their_own_memory",
            "a_description_that_is_no_srq_is_refused",
            "the_poller_completes_srq_receives_out_of_order",
            "a_cleaned_srq_receive_frees_its_wqe",
        ],
        models: Models::Both,
        why: "issue 30: DirectSrq writes SRQ WQEs, their links, wr_ids and the free bitmap \
              through raw pointers into the SRQ mlx5dv describes",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "mlx5_rq",
        tests: &[
            "a_wqe_is_data_segments_then_a_terminator_and_one_counter_store_per_publish",
            "refusals_change_nothing_and_completions_free_slots_in_order",
            "a_payload_in_the_cqe_is_scattered_over_the_wqes_segments",
            "the_poller_completes_receives_of_an_attached_queue",
            "swapped_and_forgotten_queues_stay_with_their_memory",
            "a_recv_ring_on_a_direct_queue_posts_and_takes_its_completions",
            "a_slot_released_in_order_is_reposted_by_the_counter_alone",
        ],
        models: Models::Both,
        why: "issue 30: DirectRq writes receive WQEs and wr_ids through raw pointers into the \
              queue mlx5dv describes, and scatters a CQE's payload through the addresses its \
              WQE holds",
    },
    MiriTest {
        package: "hotverbs-datapath",
        target: "mmio_doorbell",
        tests: &[
            "mmio_stores_what_the_recording_doorbell_records_for_every_copy_width",
            "one_bf_block_lands_byte_for_byte",
        ],
        models: Models::Stacked,
        why: "issue 29 item 6: the hardware doorbell's volatile stores (miri's fallback copy) \
              on plain SQ and register memory, against the recording doorbell",
    },
    MiriTest {
        package: "hotverbs-softnic",
        target: "extended",
        tests: &["raw_memory_extended_path"],
        models: Models::Both,
        why: "the extended verbs (ibv_wr_*, ibv_start_poll) on raw-pointer memory",
    },
    MiriTest {
        package: "hotverbs",
        target: "cq_events",
        tests: &[
            "events_count_into_a_word_that_does_not_move_with_the_cq",
            "last_cq_dropped_while_another_thread_takes_its_event",
            "a_failed_destroy_leaves_the_word_to_the_living_cq",
        ],
        models: Models::Both,
        why: "item 6: the CQ event word, its destroy and a racing get_cq_event",
    },
    MiriTest {
        package: "hotverbs",
        target: "cq_options",
        tests: &["events_carry_each_cqs_user_context"],
        models: Models::Stacked,
        why: "item 6: the event word shared with a user context",
    },
    MiriTest {
        package: "hotverbs",
        target: "bridge",
        tests: &["inline_traffic_end_to_end_without_unsafe"],
        models: Models::Both,
        why: "the safe bridge: rings and poller from Qp/Cq, receive lease, softnic copies",
    },
    MiriTest {
        package: "hotverbs",
        target: "mr_soundness",
        tests: &[
            "read_into_races_inline_rdma_writes",
            "write_from_races_rdma_reads",
        ],
        models: Models::Both,
        why: "item 7: Mr's atomic copies racing softnic's remote writes and reads",
    },
    MiriTest {
        package: "hotverbs",
        target: "leases",
        tests: &[
            "borrowed_memory_is_never_left_reachable_by_a_peer",
            "a_receive_region_stays_leased_until_the_qp_is_reset",
        ],
        models: Models::Stacked,
        why: "items 1, 2: registrations and receive leases over softnic's remote writes",
    },
    MiriTest {
        package: "hotverbs",
        target: "ownership",
        tests: &[
            "swapped_rings_post_to_their_own_qps",
            "reset_and_connect_under_live_rings_are_the_rings_operation",
            "a_ring_reset_keeps_the_lease",
            "drain_asks_for_the_signal_an_unsignaled_tail_needs",
            "a_direct_ring_reconnects_without_replaying_old_wqes",
            "direct_recv_rings_against_swap_a_new_poller_and_a_reset",
        ],
        models: Models::Both,
        why: "issue 27 items 1, 3, 4, 11: swap, reset and connect under live rings, a lease \
              kept across a ring's reset, drain; the direct bridge on the simulated ConnectX \
              (run at each poll, no device thread), its receive side too (issue 30)",
    },
    MiriTest {
        package: "hotverbs",
        target: "ownership",
        tests: &[
            "a_dropped_recv_ring_keeps_its_lease_until_the_qp_is_reset",
            "a_forgotten_ring_keeps_its_queue",
            "cq_poll_cannot_take_ring_completions",
            "ex_poller_reads_qp_num_or_is_refused",
            "lock_free_cq_is_armed_through_its_poller",
            "a_thread_domain_has_one_send_ring_at_a_time",
            "a_new_direct_poller_serves_the_existing_rings",
            "wr_and_direct_rings_follow_a_new_remote",
            "an_srq_ring_owns_the_srq_and_its_cq",
            "a_split_ring_recovers_once_its_retirer_is_back",
            "srq_rings_against_swap_and_a_panic",
        ],
        models: Models::Stacked,
        why: "issue 27 items 7-9, forget, thread domains, set_remote, the SRQ ring, split \
              mode's recovery: the rest of the misuse file",
    },
    MiriTest {
        package: "hotverbs",
        target: "bridge_ex",
        tests: &[
            "inline_traffic_end_to_end_without_unsafe",
            "wrong_fields_are_refused_by_name_and_one_poller_per_cq",
        ],
        models: Models::Stacked,
        why: "issue 27 items 5, 9: the extended bridge end to end (ExCqPoller field reads; \
              Tree Borrows covers them in wr_ring)",
    },
    MiriTest {
        package: "hotverbs",
        target: "bridge",
        tests: &["ud_ring_sends_to_its_address_handle"],
        models: Models::Stacked,
        why: "issue 27: a UD ring through the bridge (its AH borrowed, GRH in the slot)",
    },
    MiriTest {
        package: "hotverbs",
        target: "real_device_reconnect",
        tests: &[
            "peer_dies_mid_stream_then_the_same_ring_serves_a_new_peer",
            "an_srq_ring_serves_on_while_one_of_its_qps_is_recovered",
        ],
        models: Models::Stacked,
        why: "issue 27: a dead peer, the ring's safe recovery, a new peer (both profiles); an \
              SRQ ring serving on while one of its QPs is recovered",
    },
    MiriTest {
        package: "hotverbs",
        target: "surface",
        tests: &[
            "one_engine_runs_on_every_post_path",
            "the_surface_under_swap_forget_and_a_panic",
        ],
        models: Models::Stacked,
        why: "issue 28: the common ring surface driving the safe SendRing and WrRing: \
              batches, PostRing's forwarded unsafe stage, mem::swap of two rings, a leaked \
              batch, a panic in a generic engine",
    },
    MiriTest {
        package: "hotverbs",
        target: "post_states",
        tests: &[
            "post_send_inline_delivers_sends_and_writes",
            "receives_filled_in_init_meet_the_first_message",
        ],
        models: Models::Stacked,
        why: "issue 28: the safe inline post (Qp::post_send_inline's WR built from borrowed \
              bytes) and receives posted in INIT",
    },
];

/// `cargo xtask miri [--list]`.
pub fn run_miri(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--list") {
        for t in MIRI_TESTS {
            println!(
                "{} --test {}: {} ({})",
                t.package,
                t.target,
                t.tests.join(" "),
                t.why
            );
        }
        return Ok(());
    }
    if let Some(a) = args.first() {
        return Err(format!("unknown option {a:?} (use --list)"));
    }
    ensure_toolchain()?;
    let t0 = Instant::now();
    // Two lanes on the two cores (miri interprets on one thread): the setup layer's tests
    // in one, the datapath's and softnic's in the other, each with a target directory of
    // its own (`cargo miri test` holds its directory's build lock while the tests run).
    // Each run's output is printed whole when it ends, so lanes never interleave lines.
    // Balanced by a measured run (lane 0 316 s, lane 1 300 s and its own build of the setup
    // layer for `bridge_ex`).
    let in_lane0 = |t: &&MiriTest| t.package == "hotverbs" && t.target != "bridge_ex";
    let lanes: [Vec<&MiriTest>; 2] = [
        MIRI_TESTS.iter().filter(in_lane0).collect(),
        MIRI_TESTS.iter().filter(|t| !in_lane0(t)).collect(),
    ];
    let print = std::sync::Mutex::new(());
    let results: Vec<Result<usize, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(lane, tests)| {
                let print = &print;
                scope.spawn(move || run_lane(lane, tests, print))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a miri lane panicked".into()))
            })
            .collect()
    });
    let mut runs = 0;
    for r in results {
        runs += r?;
    }
    eprintln!(
        "miri: {runs} runs of {} selected tests passed in {:.0} s (two lanes)",
        MIRI_TESTS.iter().map(|t| t.tests.len()).sum::<usize>(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One lane's runs, in order, in target directory `lane`; stops at its first failure.
fn run_lane(
    lane: usize,
    tests: &[&MiriTest],
    print: &std::sync::Mutex<()>,
) -> Result<usize, String> {
    let mut runs = 0;
    for t in tests {
        let models: &[(&str, &str)] = match t.models {
            Models::Stacked => &[("stacked borrows", "")],
            Models::Both => &[
                ("stacked borrows", ""),
                ("tree borrows", "-Zmiri-tree-borrows"),
            ],
        };
        for (name, flag) in models {
            let mut cmd = nightly_cargo();
            if lane > 0 {
                cmd.env(
                    "CARGO_TARGET_DIR",
                    root().join("target").join(format!("{NIGHTLY}-lane{lane}")),
                );
            }
            cmd.args(["miri", "test", "--locked", "-p", t.package]);
            // `lib`: the crate's unit tests (names are their module paths).
            if t.target == "lib" {
                cmd.arg("--lib");
            } else {
                cmd.args(["--test", t.target]);
            }
            cmd.arg("--")
                .arg("--exact")
                .args(t.tests)
                .env(
                    "MIRIFLAGS",
                    format!("-Zmiri-disable-isolation {flag}").trim(),
                )
                .current_dir(root());
            let started = Instant::now();
            let out = cmd.output().map_err(|e| format!("{}: {e}", show(&cmd)))?;
            {
                let _one_at_a_time = print.lock().unwrap_or_else(|e| e.into_inner());
                eprintln!(
                    "miri lane {lane} ({name}): {} --test {} — {} [{:.0} s]",
                    t.package,
                    t.target,
                    t.why,
                    started.elapsed().as_secs_f64()
                );
                eprintln!("$ {}", show(&cmd));
                eprint!("{}", String::from_utf8_lossy(&out.stderr));
                eprint!("{}", String::from_utf8_lossy(&out.stdout));
            }
            if !out.status.success() {
                return Err(format!(
                    "miri lane {lane}: {} --test {} ({name}) failed: {}",
                    t.package, t.target, out.status
                ));
            }
            runs += 1;
        }
    }
    Ok(runs)
}

/// The nightly miri runs on, pinned: a fresh machine installs this one, so a later
/// nightly (a new miri check, a changed flag, a build break) never changes what this step
/// does. Moving it is a one-line change, made on purpose and tested like any other.
pub const NIGHTLY: &str = "nightly-2026-05-20";

/// `cargo` of the pinned nightly toolchain, without the stable toolchain's environment
/// leaking in.
fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", NIGHTLY, "cargo"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env("CARGO_TERM_COLOR", "never")
        // A target directory per pinned nightly: artifacts another nightly of the same
        // version left in `target/miri` are taken as fresh by cargo but do not link
        // against this toolchain's miri sysroot (E0463 "can't find crate").
        .env("CARGO_TARGET_DIR", root().join("target").join(NIGHTLY));
    c
}

/// Installs the pinned nightly ([`NIGHTLY`]) with miri and rust-src if missing, then
/// `cargo miri setup`.
fn ensure_toolchain() -> Result<(), String> {
    let have = |args: &[&str]| {
        Command::new("rustup")
            .args(args)
            .env_remove("RUSTUP_TOOLCHAIN")
            .output()
            .map(|o| o.status.success() && !o.stdout.is_empty())
            .unwrap_or(false)
    };
    let installed = Command::new("rustup")
        .arg(format!("+{NIGHTLY}"))
        .args(["component", "list", "--installed"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    match installed {
        None => {
            if !have(&["--version"]) {
                return Err("rustup not found: miri needs the nightly toolchain via rustup".into());
            }
            run(Command::new("rustup")
                .args(["toolchain", "install", NIGHTLY, "--profile", "minimal"])
                .args(["--component", "miri", "--component", "rust-src"])
                .env_remove("RUSTUP_TOOLCHAIN"))?;
        }
        Some(list) => {
            let missing: Vec<&str> = ["miri", "rust-src"]
                .into_iter()
                .filter(|c| !list.lines().any(|l| l.starts_with(c)))
                .collect();
            if !missing.is_empty() {
                run(Command::new("rustup")
                    .args(["component", "add", "--toolchain", NIGHTLY])
                    .args(&missing)
                    .env_remove("RUSTUP_TOOLCHAIN"))?;
            }
        }
    }
    let mut setup = nightly_cargo();
    setup.args(["miri", "setup"]).current_dir(root());
    eprintln!("$ {}", show(&setup));
    let out = setup
        .output()
        .map_err(|e| format!("{}: {e}", show(&setup)))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo miri setup` failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}
