//! The only place softnic touches user memory.
//!
//! # Invariants
//! Every pointer handed to these functions was produced by
//! [`crate::fabric::Fabric::resolve`] (or points into softnic's own buffers, or is the
//! non-empty source buffer of an `IBV_SEND_INLINE` WR read during the `ibv_post_send` call
//! that passed it, which `ibv_post_send(3)` requires to be readable then): it lies inside
//! a memory region that is registered at the time of the call (the caller holds the
//! fabric lock, so it cannot be deregistered meanwhile) and the whole `[ptr, ptr + len)`
//! range was bounds-checked against that region. A [`Seg`] also carries the bounds
//! `[mr_lo, mr_hi)` of that whole region, and its pointer may be used anywhere inside
//! them. `ibv_reg_mr(3)` makes the application promise that a registered range stays
//! mapped and accessible until `ibv_dereg_mr`, exactly as hardware relies on. Pointers
//! into registered memory carry the provenance of the address the application registered
//! (`ibv_mr.addr`), never one rebuilt from an integer; only an inline SGE (an integer
//! address in no MR) is turned into a pointer, with the provenance the application
//! exposed when it took the address, and it is read (plainly: [`read_inline`]) only during
//! the post that names it.
//!
//! # Memory model: softnic is not a DMA engine
//! A real NIC's DMA is outside the language's memory model; softnic runs in the
//! application's address space and is inside it. The application may race with the
//! device on registered memory (a peer writes while `hotverbs::Mr::read_into` reads), and
//! Rust only allows that if both sides use atomics **of the same size at the same
//! address** (racing plain accesses are undefined behaviour, and so are racing atomic
//! accesses of different sizes unless both are loads). So every access to registered
//! application memory is a relaxed atomic, sized by the one rule of the project, shared
//! with `hotverbs::Mr` (`verbs/src/mr.rs`):
//!
//! > **The memory region decides the unit, not the operation.** Every 8-byte-aligned word
//! > lying wholly inside the registered region `[mr.addr, mr.addr + mr.length)` is always
//! > accessed as one `AtomicU64`; the bytes of the region outside such words (its ragged
//! > head and tail, when the region does not start or end on a word boundary) are always
//! > accessed as `AtomicU8`. An operation that covers only part of a region word loads the
//! > whole word and uses the bytes it needs, or stores its bytes by a
//! > `compare_exchange_weak` loop on the word that merges them into the current value (so
//! > a concurrent writer of the word's other bytes is never lost).
//!
//! [`unit_at`] is the rule. Because it depends only on the region, which both sides know
//! (softnic from the registration, `Mr` from itself), an application copy and a device
//! copy meet with equal sizes whatever ranges they cover. Ordering comes from elsewhere
//! (the fabric lock, the completion the application polls), so the copies are `Relaxed`.
//! RDMA atomics are `AtomicU64` on aligned words inside the region, as `Mr::read_u64` /
//! `write_u64` are: the same unit.
//!
//! A store to part of a word is an atomic read-modify-write of the whole word: it writes the
//! word's other bytes back with the values it read, so nothing is lost, but the application
//! may access no byte of that word plainly meanwhile (its unchecked slices of an MR already
//! exclude every device write to the MR).
//!
//! The rule is per registration: memory registered twice, by regions whose ends cut a word
//! differently, has that word as an `AtomicU64` in one and as bytes in the other, so racing
//! accesses to it must go through one of the two registrations on both sides.
//!
//! softnic's own buffers (an inline WR's captured bytes, an atomic's original value, a UD
//! receive's GRH) are no application region: each is handed over as a [`Seg`] whose region
//! is the buffer itself ([`Seg::own`]), so the same code copies from them. Inline SGEs are
//! the exception: [`read_inline`] reads them plainly (they may be read-only memory, and
//! nobody writes them during the post).
//!
//! Source and destination may overlap (loopback QPs): each piece is copied as `memmove`
//! would, backwards when the destination starts inside the source.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// A resolved host memory segment: `len` bytes at `ptr`, inside the memory region
/// `[mr_lo, mr_hi)` (addresses) whose words decide the access sizes (module docs). `ptr`
/// carries provenance over the whole region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// First address of the region (set only by the constructors, so a Seg always lies
    /// inside its region).
    mr_lo: usize,
    /// One past the last address of the region.
    mr_hi: usize,
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
            mr_lo: 0,
            mr_hi: 0,
        }
    }
}

impl Seg {
    /// `len` bytes at `ptr`, which lie inside the registered region `[mr_lo, mr_hi)`.
    #[inline]
    pub(crate) fn in_mr(ptr: *mut u8, len: usize, mr_lo: usize, mr_hi: usize) -> Seg {
        debug_assert!(mr_lo <= ptr.addr() && len <= mr_hi.saturating_sub(ptr.addr()));
        Seg {
            ptr,
            len,
            mr_lo,
            mr_hi,
        }
    }

    /// `len` bytes of one of softnic's own buffers: the buffer is its own region (module
    /// docs).
    #[inline]
    pub(crate) fn own(ptr: *mut u8, len: usize) -> Seg {
        Seg::in_mr(ptr, len, ptr.addr(), ptr.addr() + len)
    }

    fn region(&self) -> Region {
        Region {
            lo: self.mr_lo,
            hi: self.mr_hi,
        }
    }
}

/// The bounds `[lo, hi)` of a memory region, which decide its access units.
#[derive(Clone, Copy, Debug)]
struct Region {
    lo: usize,
    hi: usize,
}

impl Region {
    /// Whether the 8-aligned word at `w` lies wholly inside the region.
    #[inline]
    fn has_word(self, w: usize) -> bool {
        w >= self.lo && self.hi.saturating_sub(w) >= 8
    }
}

/// The access softnic makes to reach address `addr` of the memory region `[lo, hi)` (the
/// registered region, not the operation's range): `(start, 8)` for the 8-byte-aligned word
/// holding `addr` if that word lies wholly inside the region, else `(addr, 1)`. The one
/// rule of the project, shared with `hotverbs::Mr` (module docs).
#[inline]
fn unit_at(addr: usize, lo: usize, hi: usize) -> (usize, usize) {
    let w = addr & !7;
    if (Region { lo, hi }).has_word(w) {
        (w, 8)
    } else {
        (addr, 1)
    }
}

/// Relaxed atomic load of the region word at `p`.
///
/// # Safety
/// `p` is 8-aligned and readable for 8 bytes (module invariants: a word of the region).
#[inline]
unsafe fn load_word(p: *const u8) -> u64 {
    // SAFETY: aligned and readable (caller); the memory is only accessed atomically, with
    // this size, while softnic or a racing application touches it (module docs).
    unsafe { AtomicU64::from_ptr(p.cast_mut().cast()) }.load(Ordering::Relaxed)
}

/// Relaxed atomic store of the whole region word at `p`.
///
/// # Safety
/// `p` is 8-aligned and writable for 8 bytes (module invariants: a word of the region).
#[inline]
unsafe fn store_word(p: *mut u8, v: u64) {
    // SAFETY: as load_word.
    unsafe { AtomicU64::from_ptr(p.cast()) }.store(v, Ordering::Relaxed);
}

/// Stores the bytes of `v` selected by `mask` (`0xff` per byte) into the region word at
/// `p`, leaving its other bytes as they are even while someone else writes them: a
/// compare-exchange loop that merges into the current value.
///
/// # Safety
/// As [`store_word`].
#[inline]
unsafe fn merge_word(p: *mut u8, v: u64, mask: u64) {
    // SAFETY: as load_word.
    let a = unsafe { AtomicU64::from_ptr(p.cast()) };
    let mut cur = a.load(Ordering::Relaxed);
    loop {
        let new = (cur & !mask) | (v & mask);
        match a.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
}

/// Relaxed atomic load of the byte at `p`.
///
/// # Safety
/// `p` is readable (module invariants).
#[inline]
unsafe fn load_byte(p: *const u8) -> u8 {
    // SAFETY: readable (caller); u8 atomics need no alignment.
    unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed)
}

/// Relaxed atomic store of the byte at `p`.
///
/// # Safety
/// `p` is writable (module invariants).
#[inline]
unsafe fn store_byte(p: *mut u8, b: u8) {
    // SAFETY: writable (caller); u8 atomics need no alignment.
    unsafe { AtomicU8::from_ptr(p) }.store(b, Ordering::Relaxed);
}

/// Reads the bytes of `[base, base + n)` in any order, loading each [`unit_at`] of the
/// region they lie in once (cached): whatever order the writer asks for bytes in, the
/// source is read with the sizes the region gives.
struct Loader {
    base: *const u8,
    region: Region,
    /// Address and length of the cached unit (may start before `base`, or end after
    /// `base + n`: a region word the range covers in part).
    at: usize,
    len: usize,
    buf: [u8; 8],
}

impl Loader {
    fn new(base: *const u8, region: Region) -> Self {
        Loader {
            base,
            region,
            at: 0,
            len: 0,
            buf: [0; 8],
        }
    }

    /// The byte at offset `off` (< n).
    ///
    /// # Safety
    /// `[base, base + n)` is readable and lies inside the region, through `base`'s
    /// provenance (module invariants).
    #[inline]
    unsafe fn byte(&mut self, off: usize) -> u8 {
        let addr = self.base.addr() + off;
        if addr.wrapping_sub(self.at) >= self.len {
            let (a, len) = unit_at(addr, self.region.lo, self.region.hi);
            self.at = a;
            self.len = len;
            let p = self.base.with_addr(a);
            if len == 8 {
                // SAFETY: a word wholly inside the region (`unit_at`), reached through the
                // region's provenance (caller).
                self.buf = unsafe { load_word(p) }.to_ne_bytes();
            } else {
                // SAFETY: `p == base + off`, inside the readable range (caller).
                self.buf[0] = unsafe { load_byte(p) };
            }
        }
        self.buf[addr - self.at]
    }
}

/// Copies `n > 0` bytes from `src` (in region `sr`) to `dst` (in region `dr`) with
/// `memmove` semantics, reading and writing each region with its units (module docs).
///
/// # Safety
/// `[src, src + n)` is readable and lies inside `sr`, `[dst, dst + n)` is writable and
/// lies inside `dr`; the pointers carry provenance over their whole regions and the
/// regions are accessible (module invariants).
unsafe fn copy(dst: *mut u8, dr: Region, src: *const u8, sr: Region, n: usize) {
    let (d, s) = (dst.addr(), src.addr());
    debug_assert!(dr.lo <= d && d + n <= dr.hi && sr.lo <= s && s + n <= sr.hi);
    // memmove: a destination starting inside the source is written from the end, so every
    // source byte is read before the write that overlaps it. (Whole-word loads and merging
    // stores touch bytes outside the ranges, but a merge rewrites those with the value it
    // read, so only the copied bytes change.)
    let backward = d > s && d - s < n;
    if (d ^ s) & 7 == 0 {
        // SAFETY: forwarded (caller).
        unsafe { copy_same_phase(dst, dr, src, sr, n, backward) };
        return;
    }
    let mut src_bytes = Loader::new(src, sr);
    let mut k = if backward { n } else { 0 };
    while (backward && k > 0) || (!backward && k < n) {
        let probe = if backward { d + k - 1 } else { d + k };
        let (a, len) = unit_at(probe, dr.lo, dr.hi);
        // The offsets of the unit that this copy covers.
        let from = a.max(d) - d;
        let to = (a + len).min(d + n) - d;
        let p = dst.with_addr(a);
        if len == 8 {
            let mut w = [0u8; 8];
            let mut mask = [0u8; 8];
            for off in from..to {
                // SAFETY: off < n; the source range is readable (caller).
                w[d + off - a] = unsafe { src_bytes.byte(off) };
                mask[d + off - a] = 0xff;
            }
            let v = u64::from_ne_bytes(w);
            if to - from == 8 {
                // SAFETY: a word wholly inside the destination range (hence region),
                // through the region's provenance (caller).
                unsafe { store_word(p, v) };
            } else {
                // SAFETY: a word of the destination region (`unit_at`), through the
                // region's provenance (caller).
                unsafe { merge_word(p, v, u64::from_ne_bytes(mask)) };
            }
        } else {
            // SAFETY: from < n; the source range is readable (caller).
            let b = unsafe { src_bytes.byte(from) };
            // SAFETY: `p == dst + from`, inside the writable destination range (caller).
            unsafe { store_byte(p, b) };
        }
        k = if backward { from } else { to };
    }
}

/// [`copy`] when `src` and `dst` have the same offset within a word (the common case:
/// both buffers aligned alike). Then the words of both ranges line up: the aligned words
/// wholly inside the copy are words of both regions (u64 load, u64 store), and what is
/// left is at most one partial word at each end ([`copy_in_word`]) — no per-unit search.
///
/// # Safety
/// As [`copy`], and `(src ^ dst) & 7 == 0`.
#[inline]
unsafe fn copy_same_phase(
    dst: *mut u8,
    dr: Region,
    src: *const u8,
    sr: Region,
    n: usize,
    backward: bool,
) {
    let head = ((8 - (dst.addr() & 7)) & 7).min(n);
    let words = (n - head) / 8;
    let tail = head + words * 8;
    let edge = |i: usize, k: usize| {
        if k > 0 {
            // SAFETY: callers pass `[i, i + k)` = `[0, head)` or `[tail, n)`, inside the
            // ranges and within one word of each (same phase); the rest is forwarded
            // (caller of copy_same_phase).
            unsafe { copy_in_word(dst, dr, src, sr, i, k) };
        }
    };
    let word = |i: usize| {
        // SAFETY: callers pass `i = head + 8k` with `i + 8 <= tail <= n`: both words are
        // 8-aligned (`dst + head` is, and `src` has the same phase) and inside the ranges,
        // hence words of both regions (caller).
        unsafe { store_word(dst.add(i), load_word(src.add(i))) };
    };
    if backward {
        edge(tail, n - tail);
        let mut i = tail;
        while i > head {
            i -= 8;
            word(i);
        }
        edge(0, head);
    } else {
        edge(0, head);
        let mut i = head;
        while i < tail {
            word(i);
            i += 8;
        }
        edge(tail, n - tail);
    }
}

/// Copies bytes `[i, i + k)` of a same-phase copy (`0 < k < 8`), which lie within one
/// word on each side: loads the source word whole if it is a word of `sr` (else the bytes
/// one by one), and merges the bytes into the destination word if it is a word of `dr`
/// (else stores them one by one: the region's ragged edge).
///
/// # Safety
/// As [`copy_same_phase`], with `[i, i + k)` inside the ranges and within one word.
#[inline]
unsafe fn copy_in_word(dst: *mut u8, dr: Region, src: *const u8, sr: Region, i: usize, k: usize) {
    let (d, s) = (dst.addr() + i, src.addr() + i);
    let o = d & 7;
    debug_assert!(k > 0 && o + k <= 8 && s & 7 == o);
    let (wd, ws) = (d - o, s - o);
    let w = if sr.has_word(ws) {
        // SAFETY: a word of the source region, through its provenance (caller).
        unsafe { load_word(src.with_addr(ws)) }.to_ne_bytes()
    } else {
        let mut w = [0u8; 8];
        for (j, b) in w[o..o + k].iter_mut().enumerate() {
            // SAFETY: `i + j < i + k`, inside the readable source range (caller).
            *b = unsafe { load_byte(src.add(i + j)) };
        }
        w
    };
    if dr.has_word(wd) {
        let mut mask = [0u8; 8];
        mask[o..o + k].fill(0xff);
        // Bytes outside [o, o + k) are masked off; no need to clear them.
        // SAFETY: a word of the destination region, through its provenance (caller).
        unsafe {
            merge_word(
                dst.with_addr(wd),
                u64::from_ne_bytes(w),
                u64::from_ne_bytes(mask),
            )
        };
    } else {
        for (j, b) in w[o..o + k].iter().enumerate() {
            // SAFETY: `i + j < i + k`, inside the writable destination range (caller).
            unsafe { store_byte(dst.add(i + j), *b) };
        }
    }
}

/// Copies the concatenation of `src` (after skipping `src_skip` bytes) into the concatenation
/// of `dst` (after skipping `dst_skip` bytes), `len` bytes in all. Each piece (the overlap
/// of one source and one destination segment) is one [`copy`].
///
/// # Safety
/// All segments satisfy the module invariants (each lies inside its region, its pointer
/// carrying provenance over the region), and `src`/`dst` hold at least
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
                copy(
                    d.ptr.add(dst_skip),
                    d.region(),
                    s.ptr.add(src_skip),
                    s.region(),
                    len,
                )
            };
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
        let (d, s) = (&dst[di], &src[si]);
        // SAFETY: both ranges lie inside checked, registered segments (module invariants and
        // the length precondition), non-empty since n > 0 (empty segments, whose address
        // may be NULL, were skipped above); `copy` allows overlap.
        unsafe { copy(d.ptr.add(doff), d.region(), s.ptr.add(soff), s.region(), n) };
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
            .map(|b| Seg::own(b.as_mut_ptr(), b.len()))
            .collect()
    }

    /// A raw pointer that may cross to a scoped thread.
    #[derive(Clone, Copy)]
    struct Shared(*mut u8);
    // SAFETY: each test says which thread touches which bytes, and how.
    unsafe impl Send for Shared {}
    // SAFETY: as above.
    unsafe impl Sync for Shared {}

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
        let s = [null, Seg::own(src.as_mut_ptr(), 3)];
        let d = [null, Seg::own(dst.as_mut_ptr(), 3), null];
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
        // The range is the memory region's, never the operation's. Region [3, 21): bytes
        // 3..8, the word 8..16, bytes 16..21.
        assert_eq!(unit_at(3, 3, 21), (3, 1));
        assert_eq!(unit_at(7, 3, 21), (7, 1));
        assert_eq!(unit_at(8, 3, 21), (8, 8));
        assert_eq!(unit_at(13, 3, 21), (8, 8));
        assert_eq!(unit_at(16, 3, 21), (16, 1));
        assert_eq!(unit_at(20, 3, 21), (20, 1));
        // A word cut by either end of the region is bytes.
        assert_eq!(unit_at(0, 0, 7), (0, 1));
        assert_eq!(unit_at(6, 0, 7), (6, 1));
        assert_eq!(unit_at(0, 0, 8), (0, 8));
        // Region [0, 32): an operation on bytes 10..13 still meets the whole word 8..16,
        // and one on 6..18 the words 0..8 and 16..24 — what the operation covers does not
        // matter.
        for a in [10, 11, 12] {
            assert_eq!(unit_at(a, 0, 32), (8, 8));
        }
        assert_eq!(unit_at(6, 0, 32), (0, 8));
        assert_eq!(unit_at(17, 0, 32), (16, 8));
    }

    /// Every pair of source/destination phases and lengths, forwards and overlapping both
    /// ways, in regions that are whole words and regions with ragged edges, gives what
    /// `memmove` gives — and leaves every byte outside the copy as it was.
    #[test]
    fn copy_is_memmove_for_every_phase_and_overlap() {
        let lens: &[usize] = if cfg!(miri) {
            &[3, 17]
        } else {
            &[1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 40]
        };
        // Region bounds within the 96-byte buffer: whole words, and ragged at both ends.
        let regions: &[(usize, usize)] = &[(0, 96), (5, 91)];
        for &(lo, hi) in regions {
            for &n in lens {
                for so in 0..8 {
                    for doff in 0..24 {
                        let s = 8 + so;
                        let d = doff;
                        if d < lo || d + n > hi || s < lo || s + n > hi {
                            continue;
                        }
                        // One buffer, so the ranges may overlap; aligned base (u64 storage).
                        let mut words = [0u64; 12];
                        let base = words.as_mut_ptr().cast::<u8>();
                        let mut model = [0u8; 96];
                        for (i, m) in model.iter_mut().enumerate() {
                            *m = i as u8 ^ 0x5a;
                            // SAFETY: i < 96, inside `words`.
                            unsafe { base.add(i).write(*m) };
                        }
                        model.copy_within(s..s + n, d);
                        let r = Region {
                            lo: base.addr() + lo,
                            hi: base.addr() + hi,
                        };
                        // SAFETY: both ranges lie inside the region, inside `words`, reached
                        // through `base` (provenance over all of `words`).
                        unsafe { copy(base.add(d), r, base.add(s), r, n) };
                        for (i, m) in model.iter().enumerate() {
                            // SAFETY: i < 96, inside `words`.
                            let got = unsafe { base.add(i).read() };
                            assert_eq!(got, *m, "region {lo}..{hi} n {n} src {s} dst {d} byte {i}");
                        }
                    }
                }
            }
        }
    }

    /// An operation writing 3 bytes into the middle of a region word merges them into the
    /// word: the word's other 5 bytes keep their data, whichever path the copy takes (same
    /// phase or not, from a word-aligned source or a ragged one) — and so do writes by
    /// another thread to those other bytes, made meanwhile by the same rule (a
    /// compare-exchange merge on the whole word) while a third thread loads the word whole,
    /// as `hotverbs::Mr::read_into` does. Under miri this is also the proof that the
    /// device's partial-word store meets the application's accesses with the same size.
    #[test]
    fn partial_word_store_preserves_the_other_bytes() {
        // Sequentially, every source phase.
        for so in 0..8 {
            let mut dst_words = [u64::from_ne_bytes(*b"ABCDEFGH"); 3];
            let d = dst_words.as_mut_ptr().cast::<u8>();
            let mut src_words = [u64::from_ne_bytes(*b"01234567"); 2];
            let s = src_words.as_mut_ptr().cast::<u8>();
            let (dr, sr) = (
                Region {
                    lo: d.addr(),
                    hi: d.addr() + 24,
                },
                Region {
                    lo: s.addr(),
                    hi: s.addr() + 16,
                },
            );
            // SAFETY: bytes 10..13 of `dst_words` and so..so + 3 of `src_words`, inside
            // their regions, through pointers over the whole arrays.
            unsafe { copy(d.add(10), dr, s.add(so), sr, 3) };
            let src = b"0123456701234567";
            let mut want = *b"ABCDEFGHABCDEFGHABCDEFGH";
            want[10..13].copy_from_slice(&src[so..so + 3]);
            // SAFETY: 24 bytes of the live local array, no other access now.
            let got = unsafe { core::slice::from_raw_parts(d, 24) };
            assert_eq!(got, want, "source phase {so}");
        }

        // Concurrently: the "device" writes bytes 2..5 of the word, the "application"
        // merges bytes 0..2 and 5..8, a reader loads the word whole.
        let rounds: u8 = if cfg!(miri) { 4 } else { 100 };
        let mut word = [0u64; 1];
        let w = Shared(word.as_mut_ptr().cast::<u8>());
        let region = Region {
            lo: w.0.addr(),
            hi: w.0.addr() + 8,
        };
        let app_mask = u64::from_ne_bytes([0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0xff]);
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let w = w;
                for r in 1..=rounds {
                    let mut src = [r; 3];
                    let s = src.as_mut_ptr();
                    let sr = Region {
                        lo: s.addr(),
                        hi: s.addr() + 3,
                    };
                    // SAFETY: bytes 2..5 of the word, inside its region; the other
                    // threads access the word only as a whole AtomicU64.
                    unsafe { copy(w.0.add(2), region, s, sr, 3) };
                }
            });
            sc.spawn(move || {
                let w = w;
                for r in 1..=rounds {
                    // SAFETY: the aligned live word; every thread accesses it as an
                    // AtomicU64 (the copy merges its bytes into it).
                    unsafe { merge_word(w.0, u64::from_ne_bytes([r + 100; 8]), app_mask) };
                }
            });
            sc.spawn(move || {
                let w = w;
                for _ in 0..rounds {
                    // SAFETY: as above.
                    let v = unsafe { load_word(w.0) }.to_ne_bytes();
                    // Each side's bytes are all from one of its writes.
                    assert!(v[2] == v[3] && v[3] == v[4]);
                    assert!(v[0] == v[1] && v[1] == v[5] && v[5] == v[6] && v[6] == v[7]);
                }
            });
        });
        let r = rounds;
        assert_eq!(
            word[0].to_ne_bytes(),
            [r + 100, r + 100, r, r, r, r + 100, r + 100, r + 100]
        );
    }

    /// The bytes of a region outside its aligned words (a region that starts or ends in
    /// the middle of a word) are accessed one by one, and bytes of those words outside the
    /// region are never touched: here another thread writes them plainly meanwhile (under
    /// miri, a whole-word access by the copy would be a data race).
    #[test]
    fn ragged_edge_of_the_region_is_bytes() {
        // Region [3, 29) of a 32-byte buffer: bytes 3..8, words 8..24, bytes 24..29.
        let mut words = [0u64; 4];
        let base = Shared(words.as_mut_ptr().cast::<u8>());
        let region = Region {
            lo: base.0.addr() + 3,
            hi: base.0.addr() + 29,
        };
        for a in 3..8 {
            assert_eq!(unit_at(base.0.addr() + a, region.lo, region.hi).1, 1);
        }
        for a in 24..29 {
            assert_eq!(unit_at(base.0.addr() + a, region.lo, region.hi).1, 1);
        }
        let rounds: u8 = if cfg!(miri) { 3 } else { 100 };
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let b = base;
                for r in 1..=rounds {
                    for i in (0..3).chain(29..32) {
                        // SAFETY: bytes of `words` outside the region, which only this
                        // thread accesses (that is what the test checks).
                        unsafe { b.0.add(i).write(r) };
                    }
                }
            });
            sc.spawn(move || {
                let b = base;
                for r in 1..=rounds {
                    let mut src = [r.wrapping_add(50); 26];
                    let s = src.as_mut_ptr();
                    let sr = Region {
                        lo: s.addr(),
                        hi: s.addr() + 26,
                    };
                    // Ragged head (3..8) from a source in the same phase, the whole region
                    // from one in another phase: both edges of both paths.
                    // SAFETY: ranges inside the region of `words` and inside `src`.
                    unsafe {
                        copy(b.0.add(3), region, s.add(3), sr, 5);
                        copy(b.0.add(24), region, s.add(16), sr, 5);
                        copy(b.0.add(3), region, s, sr, 26);
                    }
                }
            });
        });
        let r = rounds;
        let mut want = [r + 50; 32];
        want[..3].fill(r);
        want[29..].fill(r);
        // SAFETY: the 32 bytes of `words`; the threads are done.
        let got = unsafe { core::slice::from_raw_parts(base.0, 32) };
        assert_eq!(got, want);
    }
}
