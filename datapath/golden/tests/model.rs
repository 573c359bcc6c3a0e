//! The golden model itself: libmlx5's known answers from the spike (mlx5-golden's
//! `spike-output.txt`), so a broken model build is caught before it judges anything.

#[cfg(golden_missing)]
#[test]
fn skipped() {
    eprintln!("{}", hotverbs_mlx5_golden::SKIPPED);
}

#[cfg(not(golden_missing))]
mod real {
    use hotverbs_ffi::*;
    use hotverbs_mlx5_golden::{Model, ModelCfg, Wr};

    fn model() -> Model {
        Model::new(ModelCfg {
            ud: false,
            uc: false,
            wqe_cnt: 64,
            max_gs: 4,
            max_inline: 64,
            qpn: 0xabc,
            cqe_cnt: 8,
            poison: 0xcc,
            cqe_size: 64,
        })
    }

    fn wr(opcode: u32, flags: u32, sges: &[ibv_sge]) -> Wr {
        Wr {
            wr_id: 0xa0,
            opcode,
            send_flags: flags,
            imm_be: 0,
            rkey: 0,
            remote_addr: 0,
            compare_add: 0,
            swap: 0,
            sges: sges.as_ptr(),
            num_sge: sges.len() as u32,
            remote_qpn: 0,
            remote_qkey: 0,
            pad: 0,
            ah: std::ptr::null_mut(),
        }
    }

    #[test]
    fn lone_inline_send_is_one_block_and_a_blueflame_copy() {
        let mut m = model();
        let payload: Vec<u8> = (0x40..0x60).collect();
        let sge = [ibv_sge {
            addr: payload.as_ptr() as u64,
            length: 32,
            lkey: 0x1111,
        }];
        m.record();
        // SAFETY: the SGE points at `payload`.
        unsafe { m.post_send(&[wr(IBV_WR_SEND, IBV_SEND_INLINE | IBV_SEND_SIGNALED, &sge)]) }
            .unwrap();
        let sq = m.sq();
        assert_eq!(
            sq[..16],
            [0, 0, 0, 0x0a, 0, 0x0a, 0xbc, 4, 0, 0, 0, 8, 0, 0, 0, 0]
        );
        assert_eq!(sq[16..20], [0x80, 0, 0, 0x20]);
        assert_eq!(sq[20..52], payload[..]);
        assert_eq!(m.dbr(), 1);
        assert_eq!(m.bf_offset(), 256);
        let st = m.stores();
        assert_eq!(st.len(), 8, "{st:?}");
        for (i, s) in st.iter().enumerate() {
            assert_eq!((s.off, s.size), (i as i64 * 8, 8));
            assert_eq!(s.raw.to_ne_bytes(), sq[i * 8..i * 8 + 8]);
        }
        let b: Vec<i32> = m.barriers().iter().map(|b| b.kind).collect();
        assert_eq!(b, [1, 2, 3], "to_device, wc_start, flush");
        assert_eq!(
            m.barriers()[0].dbr,
            0,
            "the barrier comes before the doorbell record"
        );
        assert_eq!(m.barriers()[1].dbr, 1);
    }

    #[test]
    fn a_chain_rings_one_8_byte_doorbell() {
        let mut m = model();
        let sge = [ibv_sge {
            addr: 0x7f00_0000_1000,
            length: 0x100,
            lkey: 0x2220,
        }];
        let mut w = [wr(IBV_WR_RDMA_WRITE, 0, &sge); 4];
        w[3].send_flags = IBV_SEND_SIGNALED;
        m.record();
        // SAFETY: no inline data.
        unsafe { m.post_send(&w) }.unwrap();
        assert_eq!(m.dbr(), 4);
        let st = m.stores();
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].off, 0);
        assert_eq!(st[0].raw.to_ne_bytes(), m.sq()[192..200]);
    }

    #[test]
    fn poll_cq_maps_a_remote_access_error() {
        let mut m = model();
        let sge = [ibv_sge {
            addr: 1,
            length: 8,
            lkey: 2,
        }];
        // SAFETY: no inline data.
        unsafe { m.post_send(&[wr(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, &sge)]) }.unwrap();
        let c = m.cq_buf();
        let mut cqe = [0u8; 64];
        cqe[56..60].copy_from_slice(&(0x08u32 << 24 | 0xabc).to_be_bytes());
        cqe[55] = 0x13;
        cqe[54] = 0x88;
        cqe[63] = 13 << 4;
        // SAFETY: CQE 0 of the model's CQ.
        unsafe { std::ptr::copy_nonoverlapping(cqe.as_ptr(), c, 64) };
        let wc = m.poll_cq(4);
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, IBV_WC_REM_ACCESS_ERR);
        assert_eq!(wc[0].vendor_err, 0x88);
        assert_eq!(wc[0].wr_id, 0xa0);
        assert_eq!(m.cons_index(), 1);
    }
}
