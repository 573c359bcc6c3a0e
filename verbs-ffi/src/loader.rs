//! Run-time loading of `libibverbs.so.1` (and, with feature `rdmacm`, `librdmacm.so.1`).
//!
//! Each library is opened once per process (`dlopen(RTLD_NOW | RTLD_GLOBAL)`; GLOBAL because
//! providers such as librxe are themselves `dlopen`ed by libibverbs and link back to it) and
//! never closed. Every symbol is bound with `dlvsym(name, version)` at the default version
//! codegen read from the library, so `ibv_query_port` is `ibv_query_port@IBVERBS_1.1` and
//! never the `IBVERBS_1.0` compat symbol that takes the old struct.
//!
//! Invariants of this module: the table behind a `Once` is written exactly once, before
//! its state becomes `READY` with Release ordering; readers observe `READY` with Acquire and
//! only then read it; after that it is immutable for the life of the process.

use core::cell::UnsafeCell;
use core::ffi::{c_void, CStr};
use core::fmt;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU8, Ordering};

#[cfg(feature = "rdmacm")]
use crate::RdmaCmFns;
use crate::{IbvFns, Mlx5Fns};

/// A library could not be opened. Small (< 128 bytes) and `Copy`: it is cached for the
/// life of the process and returned by value; the `dlerror` text is kept up to 80 bytes.
#[derive(Clone, Copy)]
pub struct LoadError {
    /// The soname we tried, e.g. `libibverbs.so.1`.
    pub library: &'static str,
    /// What to install, e.g. `rdma-core (Debian/Ubuntu: ibverbs-providers)`.
    pub install: &'static str,
    detail: [u8; 80],
    detail_len: u8,
}

impl LoadError {
    fn new(library: &'static str, install: &'static str, detail: Option<&CStr>) -> Self {
        let mut e = LoadError {
            library,
            install,
            detail: [0; 80],
            detail_len: 0,
        };
        if let Some(d) = detail {
            let b = d.to_bytes();
            let n = b.len().min(e.detail.len());
            e.detail[..n].copy_from_slice(&b[..n]);
            e.detail_len = n as u8;
        }
        e
    }

    /// `dlerror()`'s text at the time of the failure.
    pub fn detail(&self) -> &str {
        core::str::from_utf8(&self.detail[..self.detail_len as usize]).unwrap_or("")
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not found: install {}", self.library, self.install)?;
        if self.detail_len > 0 {
            write!(f, " (dlopen: {})", self.detail())?;
        }
        Ok(())
    }
}

impl fmt::Debug for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

const UNINIT: u8 = 0;
const RUNNING: u8 = 1;
const READY: u8 = 2;

/// A minimal `no_std` once-cell for process-wide tables (setup path only; a racing second
/// caller spins until the first finishes).
pub(crate) struct Once<T> {
    state: AtomicU8,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written once by the thread that wins UNINIT->RUNNING and published
// with Release; every reader first observes READY with Acquire. T: Sync + Send makes sharing
// the resulting `&T` across threads sound.
unsafe impl<T: Send + Sync> Sync for Once<T> {}

impl<T> Once<T> {
    pub(crate) const fn new() -> Self {
        Once {
            state: AtomicU8::new(UNINIT),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        let mut init = Some(init);
        loop {
            // Acquire: pairs with the Release store of READY below.
            match self.state.load(Ordering::Acquire) {
                READY => {
                    // SAFETY: READY is stored only after the value was fully written.
                    return unsafe { (*self.value.get()).assume_init_ref() };
                }
                UNINIT => {
                    if self
                        .state
                        .compare_exchange(UNINIT, RUNNING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        let v = init.take().map(|f| f()).expect("init runs once");
                        // SAFETY: we won UNINIT->RUNNING, so no one else writes or reads the
                        // cell until READY is published.
                        unsafe { (*self.value.get()).write(v) };
                        // Release: publishes the write above to Acquire loads of READY.
                        self.state.store(READY, Ordering::Release);
                    }
                }
                _ => core::hint::spin_loop(),
            }
        }
    }
}

struct Loaded<T> {
    result: Result<T, LoadError>,
}

/// Opens `soname` and fills a table with `fill(dlvsym)`.
fn open(soname: &'static CStr) -> Result<*mut c_void, Option<&'static CStr>> {
    // SAFETY: soname is a valid NUL-terminated string; dlopen is thread-safe.
    let handle = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl*
        // call on this thread; we copy it out immediately (LoadError::new).
        let err = unsafe { libc::dlerror() };
        if err.is_null() {
            return Err(None);
        }
        // SAFETY: non-null, NUL-terminated (see above). The 'static is a lie bounded by
        // LoadError::new copying the bytes before any other dl* call.
        return Err(Some(unsafe { CStr::from_ptr(err) }));
    }
    Ok(handle)
}

fn dlvsym(handle: *mut c_void, name: &CStr, version: &CStr) -> *mut c_void {
    // SAFETY: handle came from a successful dlopen and is never closed; the strings are
    // NUL-terminated.
    unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) }
}

static IBVERBS: Once<Loaded<IbvFns>> = Once::new();

/// The libibverbs function table, loading `libibverbs.so.1` on first use.
///
/// # Errors
/// [`LoadError`] when the library is not installed; its message says which package to
/// install. The result (success or failure) is cached for the life of the process.
///
/// # References
/// `dlopen(3)`, `dlvsym(3)`.
pub fn ibverbs() -> Result<&'static IbvFns, LoadError> {
    let loaded = IBVERBS.get_or_init(|| Loaded {
        result: match open(c"libibverbs.so.1") {
            // SAFETY: `dlvsym` on this handle returns null or the named, versioned symbol
            // of libibverbs, whose C signature the generated table declares.
            Ok(h) => Ok(unsafe { IbvFns::load_with(|n, v| dlvsym(h, n, v)) }),
            Err(detail) => Err(LoadError::new(
                "libibverbs.so.1",
                "rdma-core (Debian/Ubuntu: ibverbs-providers; Fedora/RHEL: libibverbs)",
                detail,
            )),
        },
    });
    match &loaded.result {
        Ok(t) => Ok(t),
        Err(e) => Err(*e),
    }
}

static MLX5: Once<Loaded<Mlx5Fns>> = Once::new();

/// The libmlx5 direct-verbs function table (`mlx5dv_*`), loading `libmlx5.so.1` on first
/// use, after libibverbs (which it links against; opened GLOBAL, so libmlx5 binds to the
/// same copy). `mlx5dv_init_obj` binds its default version (`MLX5_1.2`, not the compat
/// `MLX5_1.0`), as for every entry.
///
/// An absent library means "not an mlx5 system", never a failure of anything else: the
/// caller falls back to the verbs path.
///
/// # Errors
/// [`LoadError`] when libibverbs or libmlx5 is not installed (package `ibverbs-providers`).
///
/// # References
/// `mlx5dv(7)`, `mlx5dv_init_obj(3)`.
pub fn mlx5() -> Result<&'static Mlx5Fns, LoadError> {
    let loaded = MLX5.get_or_init(|| Loaded {
        result: match ibverbs().and_then(|_| {
            open(c"libmlx5.so.1").map_err(|detail| {
                LoadError::new(
                    "libmlx5.so.1",
                    "rdma-core's mlx5 provider (Debian/Ubuntu: ibverbs-providers; Fedora/RHEL: \
                     libibverbs)",
                    detail,
                )
            })
        }) {
            // SAFETY: `dlvsym` on this handle returns null or the named, versioned symbol
            // of libmlx5, whose C signature the generated table declares.
            Ok(h) => Ok(unsafe { Mlx5Fns::load_with(|n, v| dlvsym(h, n, v)) }),
            Err(e) => Err(e),
        },
    });
    match &loaded.result {
        Ok(t) => Ok(t),
        Err(e) => Err(*e),
    }
}

#[cfg(feature = "rdmacm")]
static RDMACM: Once<Loaded<RdmaCmFns>> = Once::new();

/// The librdmacm function table, loading `librdmacm.so.1` on first use.
///
/// # Errors
/// [`LoadError`] when the library is not installed (package `librdmacm1`).
///
/// # References
/// `rdma_cm(7)`.
#[cfg(feature = "rdmacm")]
pub fn rdmacm() -> Result<&'static RdmaCmFns, LoadError> {
    let loaded = RDMACM.get_or_init(|| Loaded {
        result: match open(c"librdmacm.so.1") {
            // SAFETY: as in `ibverbs`, for librdmacm's versioned symbols.
            Ok(h) => Ok(unsafe { RdmaCmFns::load_with(|n, v| dlvsym(h, n, v)) }),
            Err(detail) => Err(LoadError::new(
                "librdmacm.so.1",
                "rdma-core (Debian/Ubuntu: librdmacm1; Fedora/RHEL: librdmacm)",
                detail,
            )),
        },
    });
    match &loaded.result {
        Ok(t) => Ok(t),
        Err(e) => Err(*e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::string::ToString;

    #[test]
    fn missing_library_names_the_package() {
        let e = match open(c"libhotverbs-does-not-exist.so.9") {
            Ok(_) => panic!("a library that does not exist was opened"),
            Err(d) => LoadError::new(
                "libibverbs.so.1",
                "rdma-core (Debian/Ubuntu: ibverbs-providers)",
                d,
            ),
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("libibverbs.so.1 not found: install rdma-core"),
            "{msg}"
        );
        assert!(msg.contains("ibverbs-providers"), "{msg}");
        assert!(e.detail().contains("libhotverbs-does-not-exist"), "{msg}");
    }

    #[test]
    fn symbols_bind_the_default_version_not_compat() {
        // The table lists exactly one version per symbol, and for the symbols that also have
        // an IBVERBS_1.0 compat version, it is the 1.1 default.
        for (name, ver) in IbvFns::SYMBOLS {
            let name = name.to_str().unwrap();
            let ver = ver.to_str().unwrap();
            assert!(ver.starts_with("IBVERBS_1."), "{name}@{ver}");
            if matches!(
                name,
                "ibv_open_device"
                    | "ibv_create_qp"
                    | "ibv_query_port"
                    | "ibv_reg_mr"
                    | "ibv_get_device_list"
            ) {
                assert_eq!(ver, "IBVERBS_1.1", "{name} must bind the default version");
            }
        }
        assert!(IbvFns::SYMBOLS
            .iter()
            .any(|(n, _)| n.to_bytes() == b"ibv_query_port"));
    }

    #[test]
    fn mlx5_binds_the_default_versions() {
        // mlx5dv_init_obj has a compat MLX5_1.0 (fewer object kinds) and the default
        // MLX5_1.2; the table must name the default.
        let find = |want: &str| {
            crate::Mlx5Fns::SYMBOLS
                .iter()
                .find(|(n, _)| n.to_bytes() == want.as_bytes())
                .map(|(_, v)| v.to_str().unwrap())
        };
        assert_eq!(find("mlx5dv_init_obj"), Some("MLX5_1.2"));
        assert_eq!(find("mlx5dv_query_device"), Some("MLX5_1.0"));
        assert_eq!(find("mlx5dv_is_supported"), Some("MLX5_1.8"));
        for (n, v) in crate::Mlx5Fns::SYMBOLS {
            let v = v.to_str().unwrap();
            assert!(v.starts_with("MLX5_1."), "{n:?}@{v}");
        }
        // Loading never panics: without libmlx5 it is an error naming the package; with it
        // (ibverbs-providers installed) the three entries the direct path uses are bound.
        match mlx5() {
            Ok(t) => {
                assert!(t.mlx5dv_init_obj.is_some());
                assert!(t.mlx5dv_query_device.is_some());
                assert!(t.mlx5dv_is_supported.is_some());
            }
            Err(e) => assert!(
                e.to_string().contains("libmlx5") || e.to_string().contains("libibverbs"),
                "{e}"
            ),
        }
    }

    #[test]
    fn loading_is_cached_and_binds_what_exists() {
        // Works with or without rdma-core installed: either both calls fail the same way or
        // both return the same table with the core verbs bound.
        match (ibverbs(), ibverbs()) {
            (Ok(a), Ok(b)) => {
                assert!(core::ptr::eq(a, b), "table loaded twice");
                assert!(a.ibv_get_device_list.is_some());
                assert!(a.ibv_modify_qp.is_some());
                assert!(a.ibv_query_port.is_some());
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("cached load changed its answer"),
        }
    }

    #[test]
    fn once_runs_init_once() {
        static O: Once<u32> = Once::new();
        let mut calls = 0;
        assert_eq!(
            *O.get_or_init(|| {
                calls += 1;
                7
            }),
            7
        );
        assert_eq!(
            *O.get_or_init(|| {
                calls += 1;
                8
            }),
            7
        );
        assert_eq!(calls, 1);
    }
}
