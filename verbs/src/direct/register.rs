//! How a [`DirectRing`](crate::DirectRing) uses its QP's doorbell register: BlueFlame
//! (the WQE copied into the register's write-combining buffers) only where that is as safe
//! as libmlx5 makes it, else the 8-byte doorbell alone.
//!
//! # What libmlx5 does (rdma-core v55 `providers/mlx5/`)
//! - `qp.c` `post_send_db()`: after the doorbell record, under `bf->lock` when
//!   `bf->need_lock`, BlueFlame (`mlx5_bf_copy` to `bf->reg + bf->offset`) iff
//!   `!ctx->shut_up_bf && nreq == 1 && bf->uuarn && (inl || ctx->prefer_bf) && size > 1 &&
//!   size <= bf->buf_size / 16`, else one 8-byte doorbell store there; then
//!   `bf->offset ^= bf->buf_size` for every call that announced a WR (BlueFlame or not).
//!   `mlx5_post_send` and `mlx5_send_wr_complete` (`ibv_wr_*`) both end there.
//! - `verbs.c`: a QP in a thread domain uses the thread domain's register
//!   (`mlx5_alloc_td` -> `mlx5_attach_dedicated_uar`, allocated as a BlueFlame (write-
//!   combining) UAR, `need_lock` 0: the thread domain's QPs share it without a lock). Any
//!   other QP gets `mlx5_get_qp_uar()`: `ctx->nc_uar` (no BlueFlame) under
//!   `MLX5_SHUT_UP_BF`, else a dedicated register (one QP, no lock) while any is left, else
//!   the least used shared one (`need_lock` unless `MLX5_SINGLE_THREADED`); on kernels
//!   without dynamic UARs, the static `ctx->bfs[]` the kernel names, whose index 0 has no
//!   BlueFlame and whose medium-latency ones are shared under a lock (`mlx5.c`
//!   `need_uuar_lock`).
//! - `mlx5.c` `mlx5dv_get_qp()`: reports `bf.reg` and `bf.size = bf->buf_size` when
//!   `bf->uuarn > 0`, else 0. It does not report `need_lock`, whether the register is
//!   dedicated or shared, `shut_up_bf`, or `bf->offset`. A context's UAR pages are mapped
//!   non-cached under `MLX5_SHUT_UP_BF` (`MLX5_MMAP_GET_NC_PAGES_CMD`, falling back to
//!   the regular write-combining mapping on old kernels) and libmlx5 never copies to
//!   BlueFlame then, while mlx5dv still reports a non-zero `bf.size` for such a register
//!   of index > 0.
//!
//! # The rule
//! The ring writes BlueFlame only on a register it alone rings, whose alternation it knows
//! and that libmlx5 itself would BlueFlame on:
//! - **A thread domain's register** (hotverbs admits one send ring per thread domain and
//!   refuses libmlx5 posts on the thread domain's other QPs while a direct ring lives:
//!   `td.rs`). Any other register may be shared with QPs libmlx5 posts on from other
//!   threads under a lock the ring cannot take, and mlx5dv does not say which registers
//!   are shared: doorbell only (conservative: a dedicated register is indistinguishable).
//! - **`bf.size > 0`** (`uuarn > 0`, a device with write combining).
//! - **`MLX5_SHUT_UP_BF` unset** (read as libmlx5 reads it, `get_shut_up_bf`, when the
//!   thread domain was allocated and when the ring is built: libmlx5 read it when the
//!   context was opened, which mlx5dv does not report; either set means doorbell only).
//!   A thread domain's register is write-combining even then (`mlx5_attach_dedicated_uar`
//!   ignores `shut_up_bf`), so this follows the user's wish rather than a mapping hazard.
//! - **The alternation known**: the ring starts at the buffer libmlx5 (or the last direct
//!   ring) would use next, which hotverbs mirrors for the thread domain (`td.rs`
//!   `Register`); unknown after a verbs ring on the thread domain or when the register may
//!   be a recycled one.
//!
//! An 8-byte doorbell needs no alternation: libmlx5 itself rings registers of
//! `buf_size` 0 (`uuarn` 0, non-cached UARs) at one fixed address.

use std::fmt;

/// How a direct ring rings its QP's doorbell register; see
/// [`DirectRing::register_use`](crate::DirectRing::register_use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterUse {
    /// A lone inline WQE is copied into the register's BlueFlame buffer (the datapath
    /// ring's policy), the buffers alternating from `first_offset` (0 or `bf.size`).
    BlueFlame {
        /// The buffer offset of the ring's first doorbell.
        first_offset: u32,
    },
    /// Every post rings the 8-byte doorbell only (the datapath ring's `bf_size` 0).
    DoorbellOnly(DoorbellOnly),
}

impl RegisterUse {
    /// `sq` (from [`Qp::mlx5_sq`](crate::Qp::mlx5_sq)) rung as this says: BlueFlame from
    /// `first_offset`, or `bf_size` 0 for the doorbell alone (the datapath ring then never
    /// copies to BlueFlame). For code that builds a datapath `DirectRing` itself.
    pub fn apply_to(
        self,
        sq: hotverbs_datapath::mlx5::DirectSq,
    ) -> hotverbs_datapath::mlx5::DirectSq {
        match self {
            RegisterUse::BlueFlame { first_offset } => hotverbs_datapath::mlx5::DirectSq {
                bf_offset: first_offset,
                ..sq
            },
            RegisterUse::DoorbellOnly(_) => hotverbs_datapath::mlx5::DirectSq {
                bf_size: 0,
                bf_offset: 0,
                ..sq
            },
        }
    }
}

/// Why a direct ring rings the doorbell only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DoorbellOnly {
    /// The QP is in no thread domain: its register may be shared with other QPs that
    /// libmlx5 rings under a lock the ring cannot take.
    SharedRegister,
    /// mlx5dv reports `bf.size` 0: a register without BlueFlame (libmlx5's `uuarn` 0, or a
    /// device without write combining).
    NoBlueFlame,
    /// `MLX5_SHUT_UP_BF` is set: libmlx5 does not BlueFlame, nor does the ring.
    ShutUpBf,
    /// The register's BlueFlame alternation is not known (a verbs ring posted on a QP of
    /// the thread domain, or the register may have been a freed thread domain's).
    AlternationUnknown,
}

impl fmt::Display for RegisterUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterUse::BlueFlame { first_offset } => {
                write!(f, "BlueFlame (first buffer at +{first_offset})")
            }
            RegisterUse::DoorbellOnly(why) => write!(f, "doorbell only: {why}"),
        }
    }
}

impl fmt::Display for DoorbellOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DoorbellOnly::SharedRegister => {
                "the QP is in no thread domain, so its register may be shared (create it \
                 with a parent domain of its own thread domain for BlueFlame)"
            }
            DoorbellOnly::NoBlueFlame => "the register has no BlueFlame buffers (bf.size 0)",
            DoorbellOnly::ShutUpBf => "MLX5_SHUT_UP_BF is set",
            DoorbellOnly::AlternationUnknown => {
                "the register's BlueFlame alternation is unknown (a verbs ring used this \
                 thread domain, or its register may be a freed thread domain's)"
            }
        })
    }
}

/// What [`register_use`] decides from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegisterFacts {
    /// mlx5dv's `bf.size`.
    pub bf_size: u32,
    /// The QP is in a thread domain (its register is the thread domain's, rung by this
    /// ring alone while it lives).
    pub thread_domain: bool,
    /// `MLX5_SHUT_UP_BF` (or softnic's stand-in for it) was set.
    pub shut_up_bf: bool,
    /// The buffer the register's next write must use: the second (`Some(true)`), the
    /// first, or unknown.
    pub next: Option<bool>,
}

/// The rule of the [module docs](self).
pub(crate) fn register_use(f: &RegisterFacts) -> RegisterUse {
    let why = if !f.thread_domain {
        DoorbellOnly::SharedRegister
    } else if f.bf_size == 0 {
        DoorbellOnly::NoBlueFlame
    } else if f.shut_up_bf {
        DoorbellOnly::ShutUpBf
    } else if let Some(second) = f.next {
        return RegisterUse::BlueFlame {
            first_offset: if second { f.bf_size } else { 0 },
        };
    } else {
        DoorbellOnly::AlternationUnknown
    };
    RegisterUse::DoorbellOnly(why)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the facts: BlueFlame exactly for a thread domain's register
    /// with BlueFlame buffers, no `MLX5_SHUT_UP_BF` and a known alternation, starting at
    /// the buffer the alternation names; otherwise the first reason in the rule's order.
    #[test]
    fn register_use_for_every_combination_of_facts() {
        let mut blueflame = 0;
        for thread_domain in [false, true] {
            for bf_size in [0, 256] {
                for shut_up_bf in [false, true] {
                    for next in [None, Some(false), Some(true)] {
                        let f = RegisterFacts {
                            bf_size,
                            thread_domain,
                            shut_up_bf,
                            next,
                        };
                        let want = if !thread_domain {
                            RegisterUse::DoorbellOnly(DoorbellOnly::SharedRegister)
                        } else if bf_size == 0 {
                            RegisterUse::DoorbellOnly(DoorbellOnly::NoBlueFlame)
                        } else if shut_up_bf {
                            RegisterUse::DoorbellOnly(DoorbellOnly::ShutUpBf)
                        } else {
                            match next {
                                None => RegisterUse::DoorbellOnly(DoorbellOnly::AlternationUnknown),
                                Some(false) => RegisterUse::BlueFlame { first_offset: 0 },
                                Some(true) => RegisterUse::BlueFlame { first_offset: 256 },
                            }
                        };
                        let got = register_use(&f);
                        assert_eq!(got, want, "{f:?}");
                        blueflame += matches!(got, RegisterUse::BlueFlame { .. }) as u32;
                    }
                }
            }
        }
        assert_eq!(blueflame, 2, "BlueFlame only with every fact in its favour");
    }

    #[test]
    fn register_use_prints_its_reason() {
        let s = RegisterUse::DoorbellOnly(DoorbellOnly::ShutUpBf).to_string();
        assert!(s.contains("MLX5_SHUT_UP_BF"), "{s}");
        let s = RegisterUse::BlueFlame { first_offset: 256 }.to_string();
        assert!(s.contains("+256"), "{s}");
    }
}
