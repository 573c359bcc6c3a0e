//! The only place softnic touches user memory.
//!
//! # Invariants
//! Every pointer handed to these functions was produced by
//! [`crate::fabric::Fabric::resolve`] (or points into softnic's own buffers, or is the
//! non-empty source buffer of an `IBV_SEND_INLINE` WR read during the `ibv_post_send` call
//! that passed it, which `ibv_post_send(3)` requires to be readable then): it lies inside
//! a memory region that is registered at the time of the call (the caller holds the
//! fabric lock, so it cannot be deregistered meanwhile) and the whole `[ptr, ptr + len)`
//! range was bounds-checked against that region. `ibv_reg_mr(3)` makes the application
//! promise that a registered range stays mapped and accessible until `ibv_dereg_mr`,
//! exactly as hardware relies on. Pointers into registered memory carry the provenance of
//! the address the application registered (`ibv_mr.addr`), never one rebuilt from an
//! integer; only an inline SGE (an integer address in no MR) is turned into a pointer,
//! with the provenance the application exposed when it took the address, and it is read
//! (plainly: [`read_inline`]) only during the post that names it.
//!
//! # Memory model: softnic is not a DMA engine
//! A real NIC's DMA is outside the language's memory model; softnic runs in the
//! application's address space and is inside it. The application may race with the
//! device on registered memory (a peer writes while `hotverbs::Mr::read_into` reads), and
//! Rust only allows that if both sides use atomics **of the same size at the same
//! address** (racing plain accesses are undefined behaviour, and so are racing atomic
//! accesses of different sizes unless both are loads). So every access to registered
//! application memory here is a relaxed atomic, sized by one rule, [`unit_at`]: within the
//! range `[lo, hi)` an operation touches, an 8-byte-aligned word lying wholly inside the
//! range is accessed as one `AtomicU64`, every other byte as an `AtomicU8`. That is the
//! rule of `Mr::read_into` / `Mr::write_from` (`verbs/src/mr.rs`: `AtomicU64` at 8-aligned
//! addresses with 8 or more bytes left, else `AtomicU8`), so an application copy and a
//! device copy of the same range meet with equal sizes. Where the two ranges cover a word
//! differently (the device writes 4 bytes of a word the application reads whole), the
//! sizes still differ: only a rule that does not depend on the range, used on both sides
//! (e.g. bytes everywhere), removes that case. Ordering comes from elsewhere (the fabric
//! lock, the completion the application polls), so the accesses are `Relaxed`. RDMA
//! atomics are `AtomicU64` on aligned words, as `Mr::read_u64` / `write_u64` are.
//!
//! Source and destination may overlap (loopback QPs): each piece is copied as `memmove`
//! would, backwards when the destination starts inside the source.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// A resolved host memory segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: a Seg is only dereferenced by this module's functions, under the fabric lock,
// within the `unsafe` contracts above; the pointer itself is just an address with
// provenance and may move between threads (the fabric's scratch lists keep Segs).
unsafe impl Send for Seg {}

impl Default for Seg {
    fn default() -> Self {
        Seg {
            ptr: core::ptr::null_mut(),
            len: 0,
        }
    }
}

/// The access softnic makes to reach address `addr` inside the range `[lo, hi)` it is
/// working on: `(start, 8)` for the 8-byte-aligned word holding `addr` if that word lies
/// wholly inside the range, else `(addr, 1)`. The same rule as `hotverbs::Mr::read_into`
/// and `write_from` (module docs).
#[inline]
fn unit_at(addr: usize, lo: usize, hi: usize) -> (usize, usize) {
    let w = addr & !7;
    if w >= lo && hi - w >= 8 {
        (w, 8)
    } else {
        (addr, 1)
    }
}

/// Relaxed atomic load of the unit `(p, len)` (`len` 8 or 1) into `buf[..len]`.
///
/// # Safety
/// `p` is valid for reads of `len` bytes (module invariants) and 8-aligned if `len == 8`.
#[inline]
unsafe fn load_unit(p: *const u8, len: usize, buf: &mut [u8; 8]) {
    if len == 8 {
        // SAFETY: aligned and readable for 8 bytes (caller); the memory is only accessed
        // atomically while softnic or a racing application touches it (module docs).
        let v = unsafe { AtomicU64::from_ptr(p.cast_mut().cast()) }.load(Ordering::Relaxed);
        *buf = v.to_ne_bytes();
    } else {
        // SAFETY: readable for one byte (caller); u8 atomics need no alignment.
        buf[0] = unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Reads the bytes of `[base, base + n)` in any order, loading each [`unit_at`] of that
/// range once (cached): whatever order the writer asks for bytes in, the source is read
/// with the sizes the rule gives for the source range.
struct Loader {
    base: *const u8,
    n: usize,
    /// Offset and length of the cached unit.
    at: usize,
    len: usize,
    buf: [u8; 8],
}

impl Loader {
    fn new(base: *const u8, n: usize) -> Self {
        Loader {
            base,
            n,
            at: 0,
            len: 0,
            buf: [0; 8],
        }
    }

    /// The byte at offset `off` (< n).
    ///
    /// # Safety
    /// `[base, base + n)` is readable (module invariants).
    #[inline]
    unsafe fn byte(&mut self, off: usize) -> u8 {
        if off.wrapping_sub(self.at) >= self.len {
            let lo = self.base.addr();
            let (a, len) = unit_at(lo + off, lo, lo + self.n);
            self.at = a - lo;
            self.len = len;
            // SAFETY: the unit lies inside the readable range (by `unit_at`'s construction)
            // and is aligned when it is a word.
            unsafe { load_unit(self.base.add(self.at), len, &mut self.buf) };
        }
        self.buf[off - self.at]
    }
}

/// Copies `n > 0` bytes from `src` to `dst` (`memmove` semantics), reading and writing with
/// the module's atomic rule applied to `[src, src + n)` and `[dst, dst + n)` respectively.
///
/// # Safety
/// `src` is readable and `dst` writable for `n` bytes (module invariants).
unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    let (d, s) = (dst.addr(), src.addr());
    // memmove: a destination starting inside the source is written from the end, so every
    // source byte is read before the write that overlaps it.
    let backward = d > s && d - s < n;
    if (d ^ s) & 7 == 0 {
        // SAFETY: forwarded (caller).
        unsafe { copy_same_phase(dst, src, n, backward) };
        return;
    }
    let mut src_bytes = Loader::new(src, n);
    let mut k = if backward { n } else { 0 };
    while (backward && k > 0) || (!backward && k < n) {
        let probe = if backward { d + k - 1 } else { d + k };
        let (a, len) = unit_at(probe, d, d + n);
        let off = a - d;
        // SAFETY: off + len <= n (the unit lies inside the destination range).
        let p = unsafe { dst.add(off) };
        if len == 8 {
            let mut w = [0u8; 8];
            for (i, b) in w.iter_mut().enumerate() {
                // SAFETY: off + i < n; the source range is readable (caller).
                *b = unsafe { src_bytes.byte(off + i) };
            }
            // SAFETY: an aligned word inside the writable destination range (caller).
            unsafe { AtomicU64::from_ptr(p.cast()) }
                .store(u64::from_ne_bytes(w), Ordering::Relaxed);
        } else {
            // SAFETY: off < n; the source range is readable (caller).
            let b = unsafe { src_bytes.byte(off) };
            // SAFETY: one byte inside the writable destination range (caller).
            unsafe { AtomicU8::from_ptr(p) }.store(b, Ordering::Relaxed);
        }
        k = if backward { off } else { off + len };
    }
}

/// [`copy`] when `src` and `dst` have the same offset within a word (the common case:
/// both buffers aligned alike). Then the units of both ranges line up: bytes up to the
/// first aligned word, the words wholly inside, the bytes after — no per-unit search.
///
/// # Safety
/// As [`copy`], and `(src ^ dst) & 7 == 0`.
#[inline]
unsafe fn copy_same_phase(dst: *mut u8, src: *const u8, n: usize, backward: bool) {
    let head = ((8 - (dst.addr() & 7)) & 7).min(n);
    let words = (n - head) / 8;
    let tail = head + words * 8;
    let byte = |i: usize| {
        // SAFETY: callers pass `i < n`, so both bytes lie inside the ranges (caller of
        // copy_same_phase); u8 atomics need no alignment.
        unsafe {
            let b = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed);
            AtomicU8::from_ptr(dst.add(i)).store(b, Ordering::Relaxed);
        }
    };
    let word = |i: usize| {
        // SAFETY: callers pass `i = head + 8k` with `i + 8 <= tail <= n`: both words are
        // 8-aligned (`dst + head` is, and `src` has the same phase) and inside the ranges.
        unsafe {
            let v = AtomicU64::from_ptr(src.add(i).cast_mut().cast()).load(Ordering::Relaxed);
            AtomicU64::from_ptr(dst.add(i).cast()).store(v, Ordering::Relaxed);
        }
    };
    if backward {
        let mut i = n;
        while i > tail {
            i -= 1;
            byte(i);
        }
        while i > head {
            i -= 8;
            word(i);
        }
        while i > 0 {
            i -= 1;
            byte(i);
        }
    } else {
        let mut i = 0;
        while i < head {
            byte(i);
            i += 1;
        }
        while i < tail {
            word(i);
            i += 8;
        }
        while i < n {
            byte(i);
            i += 1;
        }
    }
}

/// Copies the concatenation of `src` (after skipping `src_skip` bytes) into the concatenation
/// of `dst` (after skipping `dst_skip` bytes), `len` bytes in all. Each piece (the overlap
/// of one source and one destination segment) is one [`copy`].
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
            unsafe { copy(d.ptr.add(dst_skip), s.ptr.add(src_skip), len) };
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
        unsafe { copy(dst[di].ptr.add(doff), src[si].ptr.add(soff), n) };
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
pub(crate) unsafe fn atomic_cmp_swap(ptr: *mut u8, compare: u64, swap: u64) -> u64 {
    // SAFETY: aligned, in a registered region (caller); `from_ptr` needs no more.
    let a = unsafe { AtomicU64::from_ptr(ptr.cast()) };
    match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(v) | Err(v) => v,
    }
}

/// Fetch-and-add on the 8 bytes at `ptr`; returns the original value.
///
/// # Safety
/// As [`atomic_cmp_swap`].
pub(crate) unsafe fn atomic_fetch_add(ptr: *mut u8, add: u64) -> u64 {
    // SAFETY: aligned, in a registered region (caller).
    let a = unsafe { AtomicU64::from_ptr(ptr.cast()) };
    a.fetch_add(add, Ordering::SeqCst)
}

/// Appends `len` bytes of application memory at address `src` (inline data named by an
/// SGE that need not be registered) to `out`. An empty range reads nothing, whatever `src`
/// is: an empty inline SGE may carry any address, NULL included. Allocation-free when
/// `out` has room for `len` more bytes.
///
/// Plain reads, not the atomics used on registered memory: the buffer may be memory the
/// application may only read (a `&[u8]`, a literal), and an atomic access needs write
/// permission under Rust's aliasing rules; and nothing may write it meanwhile — the
/// application promised it for the call (`ibv_post_send(3)`), and softnic's own writes to
/// registered memory all happen under the fabric lock this caller holds.
///
/// # Safety
/// If `len > 0`, `src` is readable for `len` bytes and not written by anyone during the
/// call (the `IBV_SEND_INLINE` contract of `ibv_post_send(3)`: the SGE addresses must be
/// valid at post time), through provenance the application exposed (an SGE address is an
/// integer: `ptr as u64`).
pub(crate) unsafe fn read_inline(out: &mut Vec<u8>, src: usize, len: usize) {
    if len == 0 {
        // `from_raw_parts` needs a non-null, aligned pointer even for an empty slice.
        return;
    }
    // An SGE carries an integer address; the application exposed the pointer it came from.
    let p = core::ptr::with_exposed_provenance::<u8>(src);
    // SAFETY: len > 0, so the caller guarantees `p` is readable (hence non-null) for `len`
    // bytes and unchanged during the call; u8 needs no alignment.
    let bytes = unsafe { core::slice::from_raw_parts(p, len) };
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(bufs: &mut [Vec<u8>]) -> Vec<Seg> {
        bufs.iter_mut()
            .map(|b| Seg {
                ptr: b.as_mut_ptr(),
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
        let null = Seg::default();
        let s = [
            null,
            Seg {
                ptr: src.as_mut_ptr(),
                len: 3,
            },
        ];
        let d = [
            null,
            Seg {
                ptr: dst.as_mut_ptr(),
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
        let p = (&mut w as *mut u64).cast::<u8>();
        // SAFETY: a live, aligned local.
        unsafe {
            assert_eq!(atomic_fetch_add(p, 5), 10);
            assert_eq!(atomic_cmp_swap(p, 1, 99), 15);
            assert_eq!(atomic_cmp_swap(p, 15, 99), 15);
        }
        assert_eq!(w, 99);
    }

    #[test]
    fn units_are_the_aligned_words_inside_the_range() {
        // [3, 21): bytes 3..8, the word 8..16, bytes 16..21.
        assert_eq!(unit_at(3, 3, 21), (3, 1));
        assert_eq!(unit_at(8, 3, 21), (8, 8));
        assert_eq!(unit_at(13, 3, 21), (8, 8));
        assert_eq!(unit_at(16, 3, 21), (16, 1));
        // A word cut by either end of the range is bytes.
        assert_eq!(unit_at(0, 0, 7), (0, 1));
        assert_eq!(unit_at(6, 0, 7), (6, 1));
        assert_eq!(unit_at(0, 0, 8), (0, 8));
    }

    /// Every pair of source/destination phases and lengths, forwards and overlapping both
    /// ways, gives what `memmove` gives.
    #[test]
    fn copy_is_memmove_for_every_phase_and_overlap() {
        let lens: &[usize] = if cfg!(miri) {
            &[7, 17]
        } else {
            &[1, 2, 7, 8, 9, 15, 16, 17, 31, 40]
        };
        for &n in lens {
            for so in 0..8 {
                for doff in 0..24 {
                    // One buffer, so the ranges may overlap; aligned base (u64 storage).
                    let mut words = [0u64; 12];
                    let base = words.as_mut_ptr().cast::<u8>();
                    let mut model = [0u8; 96];
                    for (i, m) in model.iter_mut().enumerate() {
                        *m = i as u8 ^ 0x5a;
                        // SAFETY: i < 96, inside `words`.
                        unsafe { base.add(i).write(*m) };
                    }
                    let s = 8 + so;
                    let d = doff;
                    model.copy_within(s..s + n, d);
                    // SAFETY: both ranges lie inside `words` (s + n, d + n <= 96).
                    unsafe { copy(base.add(d), base.add(s), n) };
                    for (i, m) in model.iter().enumerate() {
                        // SAFETY: i < 96, inside `words`.
                        let got = unsafe { base.add(i).read() };
                        assert_eq!(got, *m, "n {n} src {s} dst {d} byte {i}");
                    }
                }
            }
        }
    }
}
