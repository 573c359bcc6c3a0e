//! The only place softnic touches user memory.
//!
//! # Invariants
//! Every pointer handed to these functions was produced by
//! [`crate::fabric::Fabric::resolve`] (or points into softnic's own buffers, or is the
//! non-empty source buffer of an `IBV_SEND_INLINE` WR read during the `ibv_post_send` call
//! that passed it, which `ibv_post_send(3)` requires to be readable then): it lies inside a
//! memory region that is registered at the time of the call (the caller holds the fabric
//! lock, so it cannot be deregistered meanwhile) and the whole `[ptr, ptr + len)` range was
//! bounds-checked against that region. `ibv_reg_mr(3)` makes the application promise that a
//! registered range stays mapped and accessible until `ibv_dereg_mr`, exactly as hardware
//! relies on. Source and destination may overlap (loopback QPs), so copies use `memmove`.
//! The application may race with the device on that memory (as with a real NIC, whose DMA is
//! not synchronised with the CPU); softnic only ever moves bytes with `memmove`, and 8-byte
//! atomics use `AtomicU64` on addresses checked to be 8-byte aligned.

use core::sync::atomic::{AtomicU64, Ordering};

/// A resolved host memory segment (address as an integer so queues stay `Send`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seg {
    pub(crate) ptr: usize,
    pub(crate) len: usize,
}

/// Copies the concatenation of `src` (after skipping `src_skip` bytes) into the concatenation
/// of `dst` (after skipping `dst_skip` bytes), `len` bytes in all.
///
/// # Safety
/// All segments satisfy the module invariants, and `src`/`dst` hold at least
/// `src_skip + len` / `dst_skip + len` bytes.
pub(crate) unsafe fn scatter(
    dst: &[Seg],
    dst_skip: usize,
    src: &[Seg],
    src_skip: usize,
    len: usize,
) {
    if len == 0 {
        return;
    }
    // Fast path: the whole copy lies inside the first segment on both sides (the common
    // one-SGE case).
    if let (Some(d), Some(s)) = (dst.first(), src.first()) {
        if dst_skip + len <= d.len && src_skip + len <= s.len {
            // SAFETY: both ranges lie inside one checked, registered segment each (module
            // invariants), non-empty since len > 0 (so never the placeholder address of an
            // empty SGE, which may be NULL); `copy` allows overlap.
            unsafe {
                core::ptr::copy(
                    (s.ptr + src_skip) as *const u8,
                    (d.ptr + dst_skip) as *mut u8,
                    len,
                );
            }
            return;
        }
    }
    let mut remaining = len;
    let (mut di, mut doff) = locate(dst, dst_skip);
    let (mut si, mut soff) = locate(src, src_skip);
    while remaining > 0 {
        // Skip exhausted (or empty) segments.
        while doff == dst[di].len {
            di += 1;
            doff = 0;
        }
        while soff == src[si].len {
            si += 1;
            soff = 0;
        }
        let n = remaining.min(dst[di].len - doff).min(src[si].len - soff);
        // SAFETY: both ranges lie inside checked, registered segments (module invariants and
        // the length precondition), non-empty since n > 0 (empty segments, whose address
        // may be NULL, were skipped above); `copy` allows overlap.
        unsafe {
            core::ptr::copy(
                (src[si].ptr + soff) as *const u8,
                (dst[di].ptr + doff) as *mut u8,
                n,
            );
        }
        doff += n;
        soff += n;
        remaining -= n;
    }
}

/// Index and offset of byte `skip` of a segment list (may point one past a segment's end).
fn locate(segs: &[Seg], mut skip: usize) -> (usize, usize) {
    for (i, s) in segs.iter().enumerate() {
        if skip <= s.len {
            return (i, skip);
        }
        skip -= s.len;
    }
    (
        segs.len().saturating_sub(1),
        segs.last().map_or(0, |s| s.len),
    )
}

/// Compare-and-swap on the 8 bytes at `ptr`; returns the original value.
///
/// # Safety
/// `ptr` satisfies the module invariants for 8 bytes and is 8-byte aligned.
pub(crate) unsafe fn atomic_cmp_swap(ptr: usize, compare: u64, swap: u64) -> u64 {
    // SAFETY: aligned, in a registered region (caller); `from_ptr` needs no more.
    let a = unsafe { AtomicU64::from_ptr(ptr as *mut u64) };
    match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(v) | Err(v) => v,
    }
}

/// Fetch-and-add on the 8 bytes at `ptr`; returns the original value.
///
/// # Safety
/// As [`atomic_cmp_swap`].
pub(crate) unsafe fn atomic_fetch_add(ptr: usize, add: u64) -> u64 {
    // SAFETY: aligned, in a registered region (caller).
    let a = unsafe { AtomicU64::from_ptr(ptr as *mut u64) };
    a.fetch_add(add, Ordering::SeqCst)
}

/// Appends `len` bytes of application memory at `src` (inline data named by an SGE that
/// need not be registered) to `out`. An empty range reads nothing, whatever `src` is: an
/// empty inline SGE may carry any address, NULL included.
///
/// # Safety
/// If `len > 0`, `src` is readable for `len` bytes (the `IBV_SEND_INLINE` contract of
/// `ibv_post_send(3)`: the SGE addresses must be valid at post time).
pub(crate) unsafe fn read_inline(out: &mut Vec<u8>, src: usize, len: usize) {
    if len == 0 {
        // `from_raw_parts` needs a non-null, aligned pointer even for an empty slice.
        return;
    }
    // SAFETY: len > 0, so the caller guarantees `src` is readable (hence non-null) for
    // `len` bytes; u8 needs no alignment.
    let bytes = unsafe { core::slice::from_raw_parts(src as *const u8, len) };
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(bufs: &mut [Vec<u8>]) -> Vec<Seg> {
        bufs.iter_mut()
            .map(|b| Seg {
                ptr: b.as_mut_ptr() as usize,
                len: b.len(),
            })
            .collect()
    }

    #[test]
    fn scatter_across_uneven_segments_with_skips() {
        let mut src = vec![b"ab".to_vec(), Vec::new(), b"cdefg".to_vec(), b"h".to_vec()];
        let mut dst = vec![vec![0u8; 3], vec![0u8; 0], vec![0u8; 1], vec![0u8; 6]];
        let (s, d) = (segs(&mut src), segs(&mut dst));
        // Skip 1 source byte ("a") and 2 destination bytes; copy 6 bytes "bcdefg".
        // SAFETY: all segments are live local vectors of the stated lengths.
        unsafe { scatter(&d, 2, &s, 1, 6) };
        assert_eq!(dst[0], vec![0, 0, b'b']);
        assert_eq!(dst[2], vec![b'c']);
        assert_eq!(dst[3], b"defg\0\0".to_vec());
    }

    #[test]
    fn empty_ranges_at_null_are_never_touched() {
        let mut out = Vec::new();
        // SAFETY: an empty range: nothing is read (the address is NULL on purpose).
        unsafe { read_inline(&mut out, 0, 0) };
        assert!(out.is_empty());
        let mut src = b"xyz".to_vec();
        let mut dst = vec![0u8; 3];
        let null = Seg { ptr: 0, len: 0 };
        let s = [
            null,
            Seg {
                ptr: src.as_mut_ptr() as usize,
                len: 3,
            },
        ];
        let d = [
            null,
            Seg {
                ptr: dst.as_mut_ptr() as usize,
                len: 3,
            },
            null,
        ];
        // SAFETY: the non-empty segments are live local vectors; the empty ones are never
        // dereferenced (that is what this test checks).
        unsafe {
            scatter(&d, 0, &s, 0, 3);
            scatter(&[null], 0, &[null], 0, 0);
        }
        assert_eq!(dst, b"xyz");
    }

    #[test]
    fn atomics_return_the_original() {
        let mut w = 10u64;
        let p = &mut w as *mut u64 as usize;
        // SAFETY: a live, aligned local.
        unsafe {
            assert_eq!(atomic_fetch_add(p, 5), 10);
            assert_eq!(atomic_cmp_swap(p, 1, 99), 15);
            assert_eq!(atomic_cmp_swap(p, 15, 99), 15);
        }
        assert_eq!(w, 99);
    }
}
