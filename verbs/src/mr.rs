//! Memory regions (`ibv_reg_mr`, `ibv_dereg_mr`) over caller memory or owned page-aligned
//! buffers, and the descriptors the datapath needs (lkey/rkey, local SGEs, remote windows).
//!
//! Invariants: an [`Mr`] holds a clone of its [`Pd`] (the PD outlives it); for an owned
//! buffer the mapping is released only after a successful `ibv_dereg_mr` (field order +
//! `Drop`; on failure the mapping is leaked); for caller memory the `&'a mut [u8]` borrow
//! lasts as long as the `Mr<'a>`, so the memory can neither move nor be freed while
//! registered — as long as the `Mr` is dropped. Safety never depends on that: `Drop` need
//! not run (`mem::forget`, a leaked `Rc` cycle), and a forgotten `Mr` over borrowed memory
//! would stay registered after the borrow ended. So the safe [`Pd::reg_mr`] registers
//! borrowed memory for local access only (no peer can reach it with an rkey, and every way
//! to make the device write or read it through the lkey is an `unsafe` post); remote
//! access over borrowed memory goes through [`Pd::scoped_mr`] (deregistered before the
//! borrow ends, by a stack frame nobody can forget) or the `unsafe`
//! [`Pd::reg_mr_unchecked`]; owned buffers ([`Pd::alloc_mr`]) may be leaked safely.
//!
//! Receive leases: receives posted into an MR stay posted until they complete or their QP
//! is reset or destroyed, whatever happened to the Rust value that posted them (a dropped
//! receive ring does not take them back). [`Qp::lease_recv`](crate::Qp::lease_recv) and
//! [`Srq::lease_recv`](crate::Srq::lease_recv) hand out receive SGEs and mark the MR
//! leased until that reset or destroy; [`Mr::as_slice`]/[`Mr::as_mut_slice`] refuse a
//! leased MR (`EBUSY`), since the NIC may write it at any moment.
//!
//! Memory a peer can write: an MR registered with `REMOTE_WRITE` or `REMOTE_ATOMIC` can be
//! written by anyone holding its rkey ([`Mr::remote`] hands it out) at any moment, outside
//! the borrow checker's view. So no safe `&[u8]`/`&mut [u8]` is ever made over such memory:
//! [`Mr::as_slice`]/[`Mr::as_mut_slice`] return an error for it, and the copy helpers
//! ([`Mr::read_into`], [`Mr::write_from`], [`Mr::read_u64`], [`Mr::write_u64`]) access it
//! with atomic loads and stores instead, so a concurrent peer write gives a mix of old and
//! new bytes, never a data race in our code (the device side is DMA, or softnic's copies
//! standing in for it). Racing atomics must have equal sizes at equal addresses, so both
//! sides follow one rule that depends on the MR's bounds only: every 8-byte-aligned word
//! wholly inside the registered memory is one `AtomicU64` (a copy covering part of it loads
//! the word, or merges its bytes with a compare-exchange), the ragged bytes at the MR's
//! ends are `AtomicU8`s. `REMOTE_READ` alone keeps the slices: a peer's read never changes
//! the memory; while we write through `as_mut_slice`, a concurrent RDMA READ may return a
//! mix of old and new bytes, as with any NIC — ordering the two is the protocol's job
//! (write, then tell the peer with a message).
//!
//! Memory without a Rust owner: [`Pd::reg_mr_raw`] registers raw process memory (a C
//! allocation, a shared mapping) as an `Mr<'static>` under an `unsafe` contract that
//! stands in for the missing borrow. [`Pd::reg_dmabuf_mr`] registers device memory
//! exported as a dmabuf (GPU memory): it is not mapped in this process at all, its `addr`
//! is the IOVA that SGEs and peers use, and every CPU accessor (slices, copies, atomics,
//! receive leases, which a `RecvRing` reads through) refuses it with `EFAULT`
//! ([`Mr::is_mapped`]).

use std::fmt;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use hotverbs_ffi::{ibv_mr, ibv_sge};

pub use hotverbs_ffi::flags::AccessFlags;

use crate::error::{record_drop_error, Error, Result};
use crate::pd::Pd;

/// A page-aligned anonymous mapping (`mmap`), optionally on huge pages.
///
/// # Example
/// ```
/// let buf = hotverbs::OwnedBuf::new(10_000, false)?;
/// assert_eq!(buf.as_ptr() as usize % 4096, 0);
/// assert!(buf.len() >= 10_000);
/// # Ok::<(), hotverbs::Error>(())
/// ```
pub struct OwnedBuf {
    ptr: *mut u8,
    len: usize,
    map_len: usize,
    huge: bool,
}

// SAFETY: the mapping is exclusively owned; access goes through &/&mut self.
unsafe impl Send for OwnedBuf {}
// SAFETY: shared access is read-only through &self.
unsafe impl Sync for OwnedBuf {}

const HUGE_PAGE: usize = 2 << 20;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl OwnedBuf {
    /// Maps `len` zeroed bytes (rounded up to the page size). With `huge`, tries 2 MiB huge
    /// pages (`MAP_HUGETLB`) first and falls back to normal pages when none are available;
    /// [`is_huge`](Self::is_huge) says which one it got.
    ///
    /// # Errors
    /// `mmap: ENOMEM` (or the errno of mmap) when the mapping fails; `EINVAL` for `len == 0`.
    pub fn new(len: usize, huge: bool) -> Result<OwnedBuf> {
        if len == 0 {
            return Err(Error::new("mmap", libc::EINVAL).with_hint("buffer length must be > 0"));
        }
        if huge {
            let map_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
            if let Some(ptr) = Self::map(map_len, libc::MAP_HUGETLB) {
                return Ok(OwnedBuf {
                    ptr,
                    len,
                    map_len,
                    huge: true,
                });
            }
        }
        let ps = page_size();
        let map_len = len.div_ceil(ps) * ps;
        match Self::map(map_len, 0) {
            Some(ptr) => Ok(OwnedBuf {
                ptr,
                len,
                map_len,
                huge: false,
            }),
            None => Err(Error::new("mmap", hotverbs_ffi::errno())
                .with_hint(format!("could not map {map_len} bytes"))),
        }
    }

    fn map(len: usize, extra: i32) -> Option<*mut u8> {
        // SAFETY: anonymous private mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            None
        } else {
            Some(p.cast())
        }
    }

    /// Requested length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Zero length? (Never: construction rejects it.)
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Backed by huge pages?
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is our mapping, initialised (zero-filled by mmap).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping we created; no references outlive self.
        let ret = unsafe { libc::munmap(self.ptr.cast(), self.map_len) };
        if ret != 0 {
            record_drop_error(Error::new("munmap", hotverbs_ffi::errno()));
        }
    }
}

impl fmt::Debug for OwnedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("huge", &self.huge)
            .finish()
    }
}

/// A scatter/gather element: local registered memory for a work request (`struct
/// ibv_sge`). Made by [`Mr::local`]; converts to `ibv_sge` and to the datapath's own
/// descriptor by its three fields.
///
/// # Example
/// ```
/// use hotverbs::{AccessFlags, Context};
/// let pd = Context::open("softnic")?.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
/// let sge = mr.local(64, 128)?;
/// assert_eq!(sge.addr, mr.addr() + 64);
/// assert_eq!(sge.lkey, mr.lkey());
/// assert!(mr.local(4000, 200).is_err()); // out of bounds
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The MR's lkey.
    pub lkey: u32,
}

impl From<Sge> for ibv_sge {
    fn from(s: Sge) -> ibv_sge {
        ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }
    }
}

/// A window of remote memory for one-sided operations (RDMA read/write/atomics): address,
/// length and rkey. Sent to the peer in an [`Endpoint`](crate::exchange::Endpoint).
///
/// # Example
/// ```
/// use hotverbs::{AccessFlags, Context};
/// let pd = Context::open("softnic")?.alloc_pd()?;
/// let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
/// let r = mr.remote();
/// assert_eq!((r.addr, r.len, r.rkey), (mr.addr(), 4096, mr.rkey()));
/// assert_eq!(r.slice(100, 8)?.addr, r.addr + 100);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// Remote virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote MR's rkey.
    pub rkey: u32,
}

impl RemoteMr {
    /// The sub-window `[offset, offset + len)`, bounds-checked.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteMr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteMr {
                addr: self.addr + offset,
                len,
                rkey: self.rkey,
            }),
            _ => Err(
                Error::new("RemoteMr::slice", libc::EINVAL).with_hint(format!(
                    "window {offset}+{len} outside the remote MR of {} bytes",
                    self.len
                )),
            ),
        }
    }
}

/// A registered memory region (`struct ibv_mr`).
///
/// Either over caller memory borrowed for `'a` ([`Pd::reg_mr`]) or over an owned,
/// page-aligned buffer ([`Pd::alloc_mr`], `'static`). Deregistered on drop;
/// [`Mr::destroy`] returns the error instead.
///
/// # Example
/// ```
/// use hotverbs::{AccessFlags, Context};
/// let pd = Context::open("softnic")?.alloc_pd()?;
/// let mut mine = vec![0u8; 256];
/// let mr = pd.reg_mr(&mut mine, AccessFlags::LOCAL_WRITE)?; // local access only
/// assert_eq!(mr.len(), 256);
/// println!("lkey {:#x} rkey {:#x}", mr.lkey(), mr.rkey());
/// drop(mr); // deregistered: `mine` is ours again
/// mine[0] = 1;
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_reg_mr(3)`
pub struct Mr<'a> {
    mr: *mut ibv_mr,
    pd: Pd,
    access: AccessFlags,
    addr: *mut u8,
    len: usize,
    // Dropped after `mr` is deregistered (Drop runs before fields drop).
    owned: Option<OwnedBuf>,
    /// The memory is mapped in this process at `addr` (false for a dmabuf registration,
    /// whose `addr` is the IOVA and which the CPU accessors refuse).
    mapped: bool,
    /// Receive leases (see the module docs): how many QPs/SRQs may have receives posted
    /// into this MR. Shared with the leaseholders, which release on reset or destroy.
    leases: Arc<AtomicUsize>,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: the MR is an identifier plus memory we own or exclusively borrow; nothing in it
// is tied to the creating thread (verbs objects may be used from any thread).
unsafe impl Send for Mr<'_> {}
// SAFETY: through `&Mr` the memory is only read, and only in ways that tolerate other
// `&Mr` readers and concurrent peer writes: `as_slice` refuses MRs a peer can write
// (REMOTE_WRITE/REMOTE_ATOMIC), so its `&[u8]` only coexists with other reads; `read_into`
// and `read_u64` use atomic loads. Every local write (`as_mut_slice`, `write_from`,
// `write_u64`) needs `&mut Mr`, so it never overlaps a `&[u8]` handed out by `as_slice`.
// Device writes caused by posted work requests are covered by the `unsafe` posting
// functions' contracts (the memory is not accessed until the completion).
unsafe impl Sync for Mr<'_> {}

/// Access flags that let a peer (or a memory window) reach an MR without a local post.
const PEER_REACHABLE: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND);

impl Pd {
    /// `ibv_reg_mr(3)` over caller memory, borrowed (and so pinned in place) for the MR's
    /// lifetime, for **local access only** (`LOCAL_WRITE` or nothing): memory a peer can
    /// reach must not depend on `Drop` running to be deregistered before the borrow ends
    /// (a `mem::forget`ed `Mr` would leave the rkey live over memory its owner has reused).
    /// For remote access use [`alloc_mr`](Self::alloc_mr) (owned memory),
    /// [`scoped_mr`](Self::scoped_mr) (borrowed, deregistered at the end of a closure), or
    /// the `unsafe` [`reg_mr_unchecked`](Self::reg_mr_unchecked).
    ///
    /// A remote flag on borrowed memory is refused:
    /// ```
    /// # use hotverbs::{AccessFlags, Context};
    /// # let pd = Context::open("softnic")?.alloc_pd()?;
    /// let mut mine = vec![0u8; 64];
    /// let e = pd.reg_mr(&mut mine, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
    ///     .unwrap_err();
    /// assert_eq!((e.verb(), e.errno()), ("ibv_reg_mr", libc::EINVAL));
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ibv_reg_mr: EINVAL` for a remote access flag or `MW_BIND`; the verb's error, e.g.
    /// `ENOMEM` when `RLIMIT_MEMLOCK` is too low.
    pub fn reg_mr<'a>(&self, buf: &'a mut [u8], access: AccessFlags) -> Result<Mr<'a>> {
        if access.intersects(PEER_REACHABLE) {
            return Err(Error::new("ibv_reg_mr", libc::EINVAL).with_hint(
                "borrowed memory is registered for local access only (a leaked Mr would \
                 leave the rkey live after the borrow ends): use alloc_mr for remote \
                 access, scoped_mr to register borrowed memory for the length of a closure, \
                 or the unsafe reg_mr_unchecked",
            ));
        }
        let (p, l) = (buf.as_mut_ptr(), buf.len());
        self.register(p, l, access, None)
    }

    /// `ibv_reg_mr(3)` over caller memory with any access flags.
    ///
    /// # Safety
    /// The returned `Mr` is dropped (or [`destroy`](Mr::destroy)ed) before the borrow of
    /// `buf` ends: never leaked (`mem::forget`, `ManuallyDrop`, an `Rc` cycle, a
    /// `Box::leak` of memory that is later reused). Otherwise a peer holding the rkey may
    /// write or read the memory after its owner got it back.
    ///
    /// # Errors
    /// As [`reg_mr`](Self::reg_mr) without the local-only restriction.
    pub unsafe fn reg_mr_unchecked<'a>(
        &self,
        buf: &'a mut [u8],
        access: AccessFlags,
    ) -> Result<Mr<'a>> {
        let (p, l) = (buf.as_mut_ptr(), buf.len());
        self.register(p, l, access, None)
    }

    /// Registers caller memory with any access flags for the duration of `f`, and
    /// deregisters it before returning (also when `f` panics): a stack frame of this
    /// function holds the registration, and nothing can forget it, so the borrow of `buf`
    /// cannot end while a peer could still reach it.
    ///
    /// If deregistration fails (e.g. `EBUSY` with memory windows bound to it) the memory
    /// may still be reachable and the borrow cannot be handed back: the process aborts
    /// with the error on stderr. Unbind windows before the closure returns.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AccessFlags, Context};
    /// let pd = Context::open("softnic")?.alloc_pd()?;
    /// let mut mine = vec![0u8; 256];
    /// let rkey = pd.scoped_mr(&mut mine, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    ///     |mr| {
    ///         // hand mr.remote() to the peer, let it write, wait for its message ...
    ///         mr.rkey()
    ///     })?;
    /// # let _ = rkey;
    /// mine[0] = 1; // deregistered: ours again
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// The registration's error; `f` does not run then.
    pub fn scoped_mr<R>(
        &self,
        buf: &mut [u8],
        access: AccessFlags,
        f: impl FnOnce(&Mr<'_>) -> R,
    ) -> Result<R> {
        /// Deregisters on every exit, unwinding included; aborts if that fails.
        struct Scope<'m>(Option<Mr<'m>>);
        impl Drop for Scope<'_> {
            fn drop(&mut self) {
                if let Some(mr) = self.0.take() {
                    if let Err(e) = mr.destroy() {
                        eprintln!(
                            "hotverbs: Pd::scoped_mr could not deregister its memory ({e}); \
                             the borrowed buffer may still be reachable by the device or a \
                             peer, so it cannot be handed back: aborting"
                        );
                        std::process::abort();
                    }
                }
            }
        }
        let (p, l) = (buf.as_mut_ptr(), buf.len());
        let scope = Scope(Some(self.register(p, l, access, None)?));
        let mr = scope.0.as_ref().expect("registered above");
        Ok(f(mr))
    }

    /// Allocates a zeroed page-aligned buffer of `len` bytes and registers it.
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<Mr<'static>> {
        self.alloc_mr_with(len, access, false)
    }

    /// Like [`alloc_mr`](Self::alloc_mr), on huge pages when `huge` and available
    /// ([`Mr::is_huge`] tells).
    pub fn alloc_mr_with(
        &self,
        len: usize,
        access: AccessFlags,
        huge: bool,
    ) -> Result<Mr<'static>> {
        let buf = OwnedBuf::new(len, huge)?;
        let (p, l) = (buf.as_ptr(), buf.len());
        self.register(p, l, access, Some(buf))
    }

    fn register<'a>(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        owned: Option<OwnedBuf>,
    ) -> Result<Mr<'a>> {
        let f = self
            .context()
            .fns()
            .ibv_reg_mr
            .ok_or_else(|| Error::missing("ibv_reg_mr"))?;
        // SAFETY: addr..addr+len is memory we own or exclusively borrow for 'a, which
        // outlives the registration (deregistered in Drop before the borrow/owner ends).
        let mr = unsafe { f(self.as_raw(), addr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            let e = Error::from_errno("ibv_reg_mr");
            let needs_local = access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !access.contains(AccessFlags::LOCAL_WRITE);
            return Err(if e.errno() == libc::EINVAL && needs_local {
                e.with_hint("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE as well")
            } else {
                e
            });
        }
        Ok(Mr {
            mr,
            pd: self.clone(),
            access,
            addr,
            len,
            owned,
            mapped: true,
            leases: Arc::new(AtomicUsize::new(0)),
            _borrow: PhantomData,
        })
    }

    /// `ibv_reg_mr(3)` over raw process memory that no Rust value owns (a C allocator's
    /// block, a shared or device mapping the caller manages), with any access flags. The
    /// `Mr` has no borrow to tie it to the memory, hence `'static` and this contract.
    ///
    /// # Safety
    /// - `addr..addr + len` is memory of this process, valid for reads and writes and
    ///   initialised (the `Mr`'s accessors read it), from now until the `Mr` is dropped or
    ///   [`destroy`](Mr::destroy)ed — it is not freed, unmapped or remapped before;
    /// - the `Mr` is not leaked past the memory's life (`mem::forget`, an `Rc` cycle, a
    ///   static): a leaked registration leaves the lkey/rkey live over memory its owner may
    ///   reuse;
    /// - until then the memory is not accessed through Rust references in ways the
    ///   registration's peers could race: no `&[u8]`/`&mut [u8]` of the caller's over it
    ///   while a peer holding the rkey (`REMOTE_WRITE`/`REMOTE_ATOMIC`) or a posted work
    ///   request may write it. Access through the `Mr` itself ([`Mr::read_into`],
    ///   [`Mr::write_from`], the checked slices) is fine: it follows the module's rules.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AccessFlags, Context};
    /// let pd = Context::open("softnic")?.alloc_pd()?;
    /// let layout = std::alloc::Layout::from_size_align(4096, 64).unwrap();
    /// // SAFETY: a zeroed block of 4096 bytes, freed only after the Mr is dropped.
    /// let p = unsafe { std::alloc::alloc_zeroed(layout) };
    /// assert!(!p.is_null());
    /// let mut mr = unsafe {
    ///     pd.reg_mr_raw(p, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?
    /// };
    /// mr.write_from(0, b"raw")?;
    /// assert_eq!(mr.read_vec(0, 3)?, b"raw");
    /// drop(mr);
    /// // SAFETY: deregistered above; allocated with this layout.
    /// unsafe { std::alloc::dealloc(p, layout) };
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ibv_reg_mr: EINVAL` for a null `addr` with a non-zero `len`; as
    /// [`reg_mr`](Self::reg_mr) without the local-only restriction otherwise.
    ///
    /// # References
    /// `ibv_reg_mr(3)`
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<Mr<'static>> {
        if addr.is_null() && len > 0 {
            return Err(Error::new("ibv_reg_mr", libc::EINVAL)
                .with_hint("a null address with a non-zero length"));
        }
        self.register(addr, len, access, None)
    }

    /// `ibv_reg_dmabuf_mr(3)`: registers `len` bytes at `offset` of the dmabuf `fd` (device
    /// memory another driver exports, e.g. a GPU buffer), addressed by SGEs and peers as
    /// `iova..iova + len` (what [`Mr::addr`], [`Mr::local`] and [`Mr::remote`] use). The fd
    /// is only borrowed for the call: the registration holds its own reference to the
    /// dmabuf (close the fd whenever you like).
    ///
    /// The memory is not mapped in this process: [`Mr::is_mapped`] is false and the CPU
    /// accessors ([`as_slice`](Mr::as_slice), [`read_into`](Mr::read_into),
    /// [`write_from`](Mr::write_from), the atomics, receive leases and so `RecvRing`s)
    /// refuse the MR with `EFAULT`. Read and write it through its exporter (the GPU API).
    /// Its SGEs must never be sent `IBV_SEND_INLINE`: the provider would copy from the IOVA
    /// on the CPU — post sends from it on a QP with `max_inline_data` 0, or through a ring
    /// configured with `SendConfig::inline_bufs(false)` (every ring otherwise inlines
    /// buffers up to its `max_inline` by itself).
    ///
    /// softnic implements it by mapping the fd (`mmap`, shared, at `offset`) for the life
    /// of the registration, so any mappable fd (a `memfd`) stands in for a GPU buffer there.
    ///
    /// # Example
    /// ```
    /// use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    /// use hotverbs::{AccessFlags, Context};
    /// let pd = Context::open("softnic")?.alloc_pd()?;
    /// // SAFETY: a valid name and flags.
    /// let raw = unsafe { libc::memfd_create(c"buf".as_ptr(), 0) };
    /// assert!(raw >= 0);
    /// // SAFETY: a new fd, owned from here on.
    /// let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    /// file.set_len(8192).unwrap();
    /// let mr = pd.reg_dmabuf_mr(file.as_fd(), 4096, 4096, 0x10_0000,
    ///     AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// assert_eq!((mr.addr(), mr.len(), mr.is_mapped()), (0x10_0000, 4096, false));
    /// assert_eq!(mr.read_vec(0, 8).unwrap_err().errno(), libc::EFAULT);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    ///
    /// # Errors
    /// `ibv_reg_dmabuf_mr: EOPNOTSUPP` (or `ENOSYS`) with "dmabuf memory registration ... is
    /// not supported by `<device>`" when the provider, the kernel driver or the loaded
    /// libibverbs lacks it (rxe has none); `EINVAL` for `len == 0`, an IOVA range that
    /// wraps, or `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE`; the verb's error
    /// otherwise (`EBADF` for an fd that is not a dmabuf or cannot be mapped).
    ///
    /// # References
    /// `ibv_reg_dmabuf_mr(3)`
    pub fn reg_dmabuf_mr(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Mr<'static>> {
        const VERB: &str = "ibv_reg_dmabuf_mr";
        let ctx = self.context();
        let Some(f) = ctx.fns().ibv_reg_dmabuf_mr else {
            return Err(
                dmabuf_error(ctx.name(), libc::ENOSYS, access).with_hint(format!(
                    "dmabuf memory registration (GPU memory, {VERB}) is not supported by {}: the \
                 loaded libibverbs has no {VERB} (rdma-core 34 or newer has it)",
                    ctx.name()
                )),
            );
        };
        if len == 0 {
            return Err(Error::new(VERB, libc::EINVAL).with_hint("length must be > 0"));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::new(VERB, libc::EINVAL).with_hint(format!(
                "iova {iova:#x} + length {len} wraps around the address space"
            )));
        }
        // SAFETY: live PD; the fd is open for the call (the provider takes its own
        // reference to the dmabuf); no memory of this process is named.
        let mr = unsafe {
            f(
                self.as_raw(),
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access.bits() as i32,
            )
        };
        if mr.is_null() {
            return Err(dmabuf_error(ctx.name(), hotverbs_ffi::errno(), access));
        }
        Ok(Mr {
            mr,
            pd: self.clone(),
            access,
            // Not a pointer of this process: the IOVA, for SGEs and peers only.
            addr: std::ptr::without_provenance_mut(iova as usize),
            len,
            owned: None,
            mapped: false,
            leases: Arc::new(AtomicUsize::new(0)),
            _borrow: PhantomData,
        })
    }
}

/// The error of a failed `ibv_reg_dmabuf_mr` with `errno` on the device called `device`:
/// "not supported" named as such when the provider, its kernel driver or libibverbs lacks
/// dmabuf registration (libibverbs' fallback answers `EOPNOTSUPP`, older ones `ENOSYS`).
pub(crate) fn dmabuf_error(device: &str, errno: i32, access: AccessFlags) -> Error {
    let e = Error::new("ibv_reg_dmabuf_mr", errno);
    match errno {
        libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT => e.with_hint(format!(
            "dmabuf memory registration (GPU memory, ibv_reg_dmabuf_mr) is not supported by \
             {device}: use a device whose provider and kernel driver implement it (mlx5 with \
             rdma-core >= 34 on Linux >= 5.12), or stage the data through host memory \
             (Pd::alloc_mr)"
        )),
        libc::EINVAL
            if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !access.contains(AccessFlags::LOCAL_WRITE) =>
        {
            e.with_hint("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE as well")
        }
        libc::EBADF => e.with_hint("the fd is not an open dmabuf the device can import"),
        _ => e,
    }
}

impl<'a> Mr<'a> {
    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is live while self lives.
        unsafe { (*self.mr).lkey }
    }

    /// Remote key, for the peer's one-sided operations.
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is live while self lives.
        unsafe { (*self.mr).rkey }
    }

    /// Start address (as registered).
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Zero length?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Access flags it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// On huge pages? (Only owned buffers can be.)
    pub fn is_huge(&self) -> bool {
        self.owned.as_ref().is_some_and(OwnedBuf::is_huge)
    }

    /// The PD it is registered in.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The raw `ibv_mr`, valid while this `Mr` lives.
    pub fn as_raw(&self) -> *mut ibv_mr {
        self.mr
    }

    /// Start pointer of the registered memory; null for a dmabuf registration
    /// ([`is_mapped`](Self::is_mapped) false), which has no address in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        if self.mapped {
            self.addr
        } else {
            std::ptr::null_mut()
        }
    }

    /// Is the registered memory mapped in this process? False for a dmabuf registration
    /// ([`Pd::reg_dmabuf_mr`]), whose [`addr`](Self::addr) is the IOVA: then every CPU
    /// accessor refuses the MR (`EFAULT`), and so do receive leases.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    fn check_mapped(&self, what: &'static str) -> Result<()> {
        if self.mapped {
            return Ok(());
        }
        Err(Error::new(what, libc::EFAULT).with_hint(
            "a dmabuf MR (Pd::reg_dmabuf_mr) is device memory, not mapped in this process: \
             read and write it through its exporter (the GPU API); post it with Mr::local \
             and the unsafe Qp::post_send/post_recv (never inline)",
        ))
    }

    /// Can a peer write this memory: registered with `REMOTE_WRITE` or `REMOTE_ATOMIC`, or
    /// with `MW_BIND` (a type-2 memory window bound to it can grant remote write)?
    /// Then [`as_slice`](Self::as_slice)/[`as_mut_slice`](Self::as_mut_slice) refuse it;
    /// use the copy helpers or the `_unchecked` accessors.
    pub fn is_remote_writable(&self) -> bool {
        self.access.intersects(
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::MW_BIND,
        )
    }

    /// Do receives posted through a lease ([`Qp::lease_recv`](crate::Qp::lease_recv),
    /// [`Srq::lease_recv`](crate::Srq::lease_recv)) possibly still target this memory? True
    /// until every leaseholder QP was reset or destroyed (an SRQ: destroyed).
    pub fn is_leased(&self) -> bool {
        // Acquire: pairs with the Release of the leaseholder's release, so whatever the
        // device wrote before the reset is visible once this reads 0.
        self.leases.load(Ordering::Acquire) != 0
    }

    /// A receive lease on `[offset, offset + len)` for a leaseholder on PD `pd`: the SGE,
    /// and a token that keeps the MR leased until released.
    pub(crate) fn lease(
        &self,
        what: &'static str,
        pd: &Pd,
        offset: usize,
        len: usize,
    ) -> Result<(Sge, Lease)> {
        // A lease hands the region to readers on the CPU (RecvRing reads its slots).
        self.check_mapped(what)?;
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::new(what, libc::EINVAL)
                .with_hint("receives write the MR: register it with LOCAL_WRITE"));
        }
        // A parent domain shares its protection domain's scope.
        if self.pd.protection_raw() != pd.protection_raw() {
            return Err(Error::new(what, libc::EINVAL)
                .with_hint("the MR is registered in another PD than the queue's"));
        }
        let sge = self.local(offset, len).map_err(|e| {
            Error::new(what, e.errno()).with_hint(format!(
                "receive region {offset}+{len} outside the MR of {} bytes",
                self.len
            ))
        })?;
        self.leases.fetch_add(1, Ordering::Relaxed);
        Ok((sge, Lease(self.leases.clone())))
    }

    fn check_not_remote_writable(&self, what: &'static str) -> Result<()> {
        self.check_mapped(what)?;
        if self.is_remote_writable() {
            return Err(Error::new(what, libc::EACCES).with_hint(
                "the MR has REMOTE_WRITE/REMOTE_ATOMIC/MW_BIND, so a peer may write it at any \
                 time: copy with read_into/write_from/read_u64, or use the unsafe *_unchecked \
                 accessor when no peer can write",
            ));
        }
        if self.is_leased() {
            return Err(Error::new(what, libc::EBUSY).with_hint(
                "receives were posted into this MR through a lease: the NIC may write it \
                 until their QP is reset or destroyed (a dropped receive ring does not take \
                 them back); read through the ring, or copy with read_into",
            ));
        }
        Ok(())
    }

    /// The registered bytes, for an MR no peer can write.
    ///
    /// Memory the device may be writing for our own posted work requests (receives,
    /// RDMA READ/atomic results) must not be read until the covering completion; the
    /// posting functions' contracts say so.
    ///
    /// # Errors
    /// `Mr::as_slice: EACCES` when [`is_remote_writable`](Self::is_remote_writable): a
    /// `&[u8]` over memory a peer may change at any time would be a data race;
    /// `Mr::as_slice: EBUSY` when [`is_leased`](Self::is_leased) (receives may be posted).
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.check_not_remote_writable("Mr::as_slice")?;
        // SAFETY: addr..addr+len is memory we own or exclusively borrow for 'a; no peer can
        // write it (checked above) and local writes need &mut self.
        Ok(unsafe { self.as_slice_unchecked() })
    }

    /// The registered bytes, mutably, for an MR no peer can write.
    ///
    /// # Errors
    /// `Mr::as_mut_slice: EACCES` when [`is_remote_writable`](Self::is_remote_writable),
    /// `EBUSY` when [`is_leased`](Self::is_leased).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.check_not_remote_writable("Mr::as_mut_slice")?;
        // SAFETY: as in as_slice, and &mut self gives exclusive local access.
        Ok(unsafe { self.as_mut_slice_unchecked() })
    }

    /// The registered bytes, whatever the access flags.
    ///
    /// # Safety
    /// While the returned borrow lives, no peer holding this MR's rkey (or a window
    /// derived from it) may write or atomically update this memory, and no posted work
    /// request of ours may write it (receives, RDMA READ/atomic results not yet
    /// completed) — e.g. the protocol guarantees the peer's writes have completed
    /// (observed through a completion or a message) and it writes no more until told.
    ///
    /// # Panics
    /// On a dmabuf MR ([`is_mapped`](Self::is_mapped) false): it has no bytes here.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        assert!(
            self.mapped,
            "Mr::as_slice_unchecked on a dmabuf MR (not mapped here)"
        );
        // SAFETY: addr..addr+len is initialised memory we own or exclusively borrow for
        // 'a; the caller guarantees no one writes it while the borrow lives.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// The registered bytes, mutably, whatever the access flags.
    ///
    /// # Safety
    /// While the returned borrow lives, no peer holding this MR's rkey (or a window
    /// derived from it) may write or atomically update this memory, and no posted work
    /// request of ours may access it. (A peer's RDMA READ meanwhile is no race on our
    /// side; it may return a mix of old and new bytes.)
    ///
    /// # Panics
    /// On a dmabuf MR ([`is_mapped`](Self::is_mapped) false): it has no bytes here.
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        assert!(
            self.mapped,
            "Mr::as_mut_slice_unchecked on a dmabuf MR (not mapped here)"
        );
        // SAFETY: as above, the caller excludes every other accessor, and &mut self
        // gives exclusive local access.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }

    fn check_range(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        // Every caller accesses the bytes on the CPU.
        self.check_mapped(what)?;
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::new(what, libc::EINVAL).with_hint(format!(
                "range {offset}+{len} outside the MR of {} bytes",
                self.len
            ))),
        }
    }

    /// Copies `out.len()` bytes at `offset` into `out`, with relaxed atomic loads (whole
    /// 8-byte words of the MR, see the module docs): safe on every MR, even while a peer writes it — then the
    /// copy may mix old and new bytes. To see a peer's data whole, read after the
    /// completion or message that says it has landed.
    ///
    /// # Errors
    /// `Mr::read_into: EINVAL` when the range is outside the MR.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AccessFlags, Context};
    /// let pd = Context::open("softnic")?.alloc_pd()?;
    /// let mut mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    /// assert!(mr.as_slice().is_err()); // a peer may write it at any time
    /// mr.write_from(3, b"abc")?;
    /// let mut out = [0u8; 5];
    /// mr.read_into(2, &mut out)?;
    /// assert_eq!(&out, b"\0abc\0");
    /// assert_eq!(mr.read_vec(3, 3)?, b"abc");
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn read_into(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("Mr::read_into", offset, out.len())?;
        let mut i = 0;
        while i < out.len() {
            let (unit, len) = self.unit_at(offset + i);
            if len == 8 {
                // SAFETY: `unit` is an 8-aligned word wholly inside the registered memory
                // (unit_at), valid for the MR's lifetime; atomic access of the size the
                // device side uses tolerates concurrent peer writes (module docs).
                let v = unsafe { AtomicU64::from_ptr(self.addr.add(unit).cast()) }
                    .load(Ordering::Relaxed)
                    .to_ne_bytes();
                let from = offset + i - unit;
                let n = (8 - from).min(out.len() - i);
                out[i..i + n].copy_from_slice(&v[from..from + n]);
                i += n;
            } else {
                // SAFETY: a byte inside the registered memory; u8 atomics need no alignment.
                out[i] = unsafe { AtomicU8::from_ptr(self.addr.add(unit)) }.load(Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// [`read_into`](Self::read_into) a new `Vec` of `len` bytes.
    ///
    /// # Errors
    /// `Mr::read_into: EINVAL` when the range is outside the MR.
    pub fn read_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read_into(offset, &mut v)?;
        Ok(v)
    }

    /// Copies `data` to `offset` with relaxed atomic stores (whole 8-byte words of the MR;
    /// a partly covered word is merged with a compare-exchange, see the module docs): safe
    /// on every MR, even while a peer reads or writes it (the bytes then
    /// interleave). Needs `&mut self` so it never overlaps a slice from
    /// [`as_slice`](Self::as_slice). Publish the data to the peer with a later send or
    /// completion, as usual.
    ///
    /// # Errors
    /// `Mr::write_from: EINVAL` when the range is outside the MR.
    pub fn write_from(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range("Mr::write_from", offset, data.len())?;
        let mut i = 0;
        while i < data.len() {
            let (unit, len) = self.unit_at(offset + i);
            if len == 8 {
                let from = offset + i - unit;
                let n = (8 - from).min(data.len() - i);
                // SAFETY: as in read_into.
                let w = unsafe { AtomicU64::from_ptr(self.addr.add(unit).cast()) };
                if n == 8 {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&data[i..i + 8]);
                    w.store(u64::from_ne_bytes(b), Ordering::Relaxed);
                } else {
                    // Part of a word: merge, so a concurrent writer of the word's other
                    // bytes (a peer's RDMA WRITE) is never overwritten with stale bytes.
                    let mut cur = w.load(Ordering::Relaxed);
                    loop {
                        let mut b = cur.to_ne_bytes();
                        b[from..from + n].copy_from_slice(&data[i..i + n]);
                        match w.compare_exchange_weak(
                            cur,
                            u64::from_ne_bytes(b),
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        ) {
                            Ok(_) => break,
                            Err(now) => cur = now,
                        }
                    }
                }
                i += n;
            } else {
                // SAFETY: as in read_into.
                unsafe { AtomicU8::from_ptr(self.addr.add(unit)) }
                    .store(data[i], Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// The access unit for byte `off` of the MR: `(word offset, 8)` when the 8-aligned
    /// word holding it lies wholly inside the registered memory, else `(off, 1)`. The one
    /// rule of the project for memory a device may write while we read it (softnic's
    /// copies use it too, see the module docs): it depends on the MR's bounds only, never
    /// on the range one copy covers, so the application and the device always meet with
    /// atomics of equal size at equal addresses.
    #[inline]
    fn unit_at(&self, off: usize) -> (usize, usize) {
        let base = self.addr as usize;
        let word = (base + off) & !7;
        if word >= base && word + 8 <= base + self.len {
            (word - base, 8)
        } else {
            (off, 1)
        }
    }

    fn check_u64(&self, what: &'static str, offset: usize) -> Result<*mut u64> {
        self.check_range(what, offset, 8)?;
        // SAFETY: offset + 8 <= len (checked above).
        let p = unsafe { self.addr.add(offset) };
        if p as usize % 8 != 0 {
            return Err(Error::new(what, libc::EINVAL).with_hint(format!(
                "address {p:p} is not 8-byte aligned, as atomics need"
            )));
        }
        Ok(p.cast())
    }

    /// The native-endian `u64` at `offset`, loaded atomically (`Acquire`): the way to read
    /// a word a peer updates with RDMA atomics (fetch-and-add, compare-and-swap) or
    /// 8-byte RDMA writes, at any time.
    ///
    /// # Errors
    /// `Mr::read_u64: EINVAL` when the word is outside the MR or not 8-byte aligned.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AccessFlags, Context};
    /// let pd = Context::open("softnic")?.alloc_pd()?;
    /// let mut mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
    /// mr.write_u64(8, 41)?;
    /// assert_eq!(mr.read_u64(8)?, 41);
    /// assert!(mr.read_u64(4).is_err()); // unaligned
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let p = self.check_u64("Mr::read_u64", offset)?;
        // SAFETY: p is 8-aligned, in bounds and valid for the MR's lifetime.
        Ok(unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire))
    }

    /// Stores the native-endian `u64` at `offset` atomically (`Release`), e.g. to reset a
    /// word peers update with RDMA atomics.
    ///
    /// # Errors
    /// `Mr::write_u64: EINVAL` when the word is outside the MR or not 8-byte aligned.
    pub fn write_u64(&mut self, offset: usize, value: u64) -> Result<()> {
        let p = self.check_u64("Mr::write_u64", offset)?;
        // SAFETY: p is 8-aligned, in bounds and valid for the MR's lifetime.
        unsafe { AtomicU64::from_ptr(p) }.store(value, Ordering::Release);
        Ok(())
    }

    /// An SGE for `[offset, offset + len)` of this MR, bounds-checked.
    pub fn local(&self, offset: usize, len: usize) -> Result<Sge> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && len <= u32::MAX as usize => Ok(Sge {
                addr: self.addr() + offset as u64,
                length: len as u32,
                lkey: self.lkey(),
            }),
            _ => Err(Error::new("Mr::local", libc::EINVAL).with_hint(format!(
                "SGE {offset}+{len} outside the MR of {} bytes",
                self.len
            ))),
        }
    }

    /// An SGE covering the whole MR.
    pub fn sge(&self) -> Sge {
        Sge {
            addr: self.addr(),
            length: self.len.min(u32::MAX as usize) as u32,
            lkey: self.lkey(),
        }
    }

    /// The whole MR as a remote window for the peer.
    pub fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }

    fn dereg(&mut self) -> Result<()> {
        let mr = std::mem::replace(&mut self.mr, std::ptr::null_mut());
        if mr.is_null() {
            return Ok(());
        }
        let ret = match self.pd.context().fns().ibv_dereg_mr {
            // SAFETY: mr came from this table's ibv_reg_mr and is deregistered once.
            Some(f) => unsafe { f(mr) },
            None => return Err(self.leak_after_failure(Error::missing("ibv_dereg_mr"))),
        };
        if ret != 0 {
            return Err(self.leak_after_failure(Error::from_ret("ibv_dereg_mr", ret)));
        }
        Ok(())
    }

    /// The MR may still be registered: a peer holding the rkey could still write the
    /// memory, so an owned buffer is leaked (never unmapped) rather than returned to the
    /// OS. A borrowed buffer cannot be kept: see [`Mr::destroy`].
    fn leak_after_failure(&mut self, e: Error) -> Error {
        if let Some(buf) = self.owned.take() {
            std::mem::forget(buf);
            const LEAKED: &str = "the buffer was leaked, as the device may still write it";
            return match e.hint() {
                Some(h) => {
                    let h = format!("{h}; {LEAKED}");
                    e.with_hint(h)
                }
                None => e.with_hint(LEAKED),
            };
        }
        e
    }

    /// `ibv_dereg_mr(3)` now, returning its error.
    ///
    /// When deregistration fails (or `drop` sees it fail, recorded for
    /// [`take_drop_errors`](crate::take_drop_errors)) the memory may still be registered.
    /// An owned buffer ([`Pd::alloc_mr`]) is then leaked: it stays mapped for the life of
    /// the process, so a late device or peer write lands in memory nobody else uses. A
    /// borrowed buffer ([`Pd::reg_mr`]) is handed back to its owner all the same, since
    /// the borrow cannot outlive the `Mr`: if that matters (a peer still holds the rkey),
    /// leak or quarantine the memory yourself on this error, or use `alloc_mr`.
    ///
    /// # Errors
    /// The verb's error, e.g. `EBUSY` while memory windows are bound to the MR.
    pub fn destroy(mut self) -> Result<()> {
        self.dereg()
    }
}

/// One receive lease on an MR (see the module docs), held by a QP or SRQ until it is reset
/// or destroyed; [`release`](Lease::release) ends it. Dropping a lease without releasing
/// it keeps the MR leased for good (the safe side: a QP whose destroy failed may still
/// write).
#[derive(Debug)]
pub(crate) struct Lease(Arc<AtomicUsize>);

impl Lease {
    /// The leaseholder no longer has receives posted into the MR.
    pub(crate) fn release(self) {
        // Release: pairs with the Acquire in Mr::is_leased.
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.dereg() {
            record_drop_error(e);
        }
    }
}

impl fmt::Debug for Mr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmabuf_errors_name_the_missing_feature_and_the_device() {
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        for errno in [libc::EOPNOTSUPP, libc::ENOSYS, libc::EPROTONOSUPPORT] {
            let e = dmabuf_error("rxe0", errno, rw);
            assert_eq!((e.verb(), e.errno()), ("ibv_reg_dmabuf_mr", errno));
            let msg = e.to_string();
            assert!(
                msg.contains("dmabuf memory registration") && msg.contains("not supported by rxe0"),
                "{msg}"
            );
        }
        let e = dmabuf_error("mlx5_0", libc::EINVAL, AccessFlags::REMOTE_WRITE);
        assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
        let e = dmabuf_error("mlx5_0", libc::EINVAL, rw);
        assert!(!e.to_string().contains("not supported"), "{e}");
        let e = dmabuf_error("mlx5_0", libc::EBADF, rw);
        assert!(e.to_string().contains("dmabuf"), "{e}");
        let e = dmabuf_error("mlx5_0", libc::ENOMEM, rw);
        assert!(!e.to_string().contains("not supported"), "{e}");
    }
}
