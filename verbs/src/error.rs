//! The one error type of the crate: which verb failed, with which errno, and what to try.

use std::borrow::Cow;
use std::fmt;
use std::sync::Mutex;

/// A failed verb: the verb (as its man page names it, plus the QP transition for
/// `ibv_modify_qp`), the errno it returned or left, and a hint of what to do.
///
/// Displays as `ibv_modify_qp(INIT->RTR): EINVAL — path_mtu 4096 above port's active_mtu
/// 1024?`.
///
/// # Example
/// ```
/// let e = hotverbs::Error::new("ibv_reg_mr", libc::EACCES)
///     .with_hint("REMOTE_WRITE needs LOCAL_WRITE as well");
/// assert_eq!(e.errno_name(), "EACCES");
/// assert_eq!(
///     e.to_string(),
///     "ibv_reg_mr: EACCES — REMOTE_WRITE needs LOCAL_WRITE as well"
/// );
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    /// The verb, e.g. `"ibv_create_qp"` or `"ibv_modify_qp(INIT->RTR)"`.
    pub verb: &'static str,
    /// The errno value (positive), e.g. `libc::EINVAL`.
    pub errno: i32,
    /// What to check or do, when we can tell.
    pub hint: Option<Cow<'static, str>>,
}

impl Error {
    /// An error of `verb` with `errno` and no hint.
    pub fn new(verb: &'static str, errno: i32) -> Self {
        Error {
            verb,
            errno: if errno == 0 { libc::EIO } else { errno.abs() },
            hint: None,
        }
    }

    /// The same error with a hint.
    pub fn with_hint(mut self, hint: impl Into<Cow<'static, str>>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Adds a hint only when there is none yet.
    pub(crate) fn or_hint(self, hint: impl FnOnce() -> Option<String>) -> Self {
        if self.hint.is_some() {
            return self;
        }
        match hint() {
            Some(h) => self.with_hint(h),
            None => self,
        }
    }

    /// The errno's symbolic name, e.g. `"EINVAL"`.
    pub fn errno_name(&self) -> &'static str {
        hotverbs_ffi::errno_name(self.errno)
    }

    /// The error of a pointer-returning verb that returned NULL: the thread's errno (EIO if
    /// the provider forgot to set it), with the generic hint for that errno.
    pub(crate) fn from_errno(verb: &'static str) -> Self {
        let e = hotverbs_ffi::errno();
        Error::new(verb, e).or_hint(|| generic_hint(verb, e))
    }

    /// The error of an int-returning verb that returned `ret != 0`. libibverbs returns the
    /// errno value for most verbs, but some return -1 and set errno: both are handled.
    pub(crate) fn from_ret(verb: &'static str, ret: i32) -> Self {
        let e = if ret < 0 {
            let e = hotverbs_ffi::errno();
            if e == 0 {
                -ret
            } else {
                e
            }
        } else {
            ret
        };
        Error::new(verb, e).or_hint(|| generic_hint(verb, e))
    }

    /// A verb the function table does not provide (older rdma-core, or a software device
    /// without it).
    pub(crate) fn missing(verb: &'static str) -> Self {
        Error::new(verb, libc::ENOSYS).with_hint(
            "this verb is not available from the loaded library/device (older rdma-core, \
             or a device that does not implement it)",
        )
    }
}

/// Hints that depend only on the verb and errno.
fn generic_hint(verb: &str, errno: i32) -> Option<String> {
    let h = match errno {
        libc::ENOMEM if verb.starts_with("ibv_reg_mr") => {
            "could not pin the memory: raise `ulimit -l` (RLIMIT_MEMLOCK) or register less"
        }
        libc::ENOMEM => {
            "out of device or host resources: fewer/smaller objects, or raise `ulimit -l`"
        }
        libc::EACCES if verb.starts_with("ibv_reg_mr") => {
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE as well"
        }
        libc::EPERM => "permission denied: check access to /dev/infiniband/* (group rdma?)",
        libc::EBUSY if verb.starts_with("ibv_dealloc_pd") => {
            "MRs, QPs, SRQs or AHs of this PD are still alive: drop them first"
        }
        libc::EBUSY if verb.starts_with("ibv_destroy_cq") => {
            "a QP still uses this CQ, or CQ events were not acknowledged"
        }
        libc::EBUSY => "the object is still in use by another object",
        libc::ENOSYS => "no kernel RDMA support on this machine (use the softnic device)",
        libc::EOPNOTSUPP => "the device does not support this operation",
        libc::ENODEV => "no such device: list them with hotverbs::devices() or `ibv_devices`",
        _ => return None,
    };
    Some(h.to_string())
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.verb, self.errno_name())?;
        if let Some(h) = &self.hint {
            write!(f, " — {h}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({self})")
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::other(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

static DROP_ERRORS: Mutex<Vec<Error>> = Mutex::new(Vec::new());

/// Records a destroy verb that failed inside `Drop` (where it cannot be returned): printed
/// to stderr and kept for [`take_drop_errors`].
pub(crate) fn record_drop_error(e: Error) {
    eprintln!("hotverbs: destroy failed during drop: {e}");
    if let Ok(mut v) = DROP_ERRORS.lock() {
        if v.len() < 1024 {
            v.push(e);
        }
    }
}

/// Destroy failures that happened in `Drop` since the last call (oldest first).
///
/// Every object also has an explicit `destroy(self) -> Result<()>` (or `close`) that returns
/// the verb's error instead; `Drop` can only report it, which it does by printing to stderr
/// and recording it here, so a test or a long-running program can check that teardown was
/// clean.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// drop(ctx.alloc_pd()?);
/// assert!(hotverbs::take_drop_errors().is_empty());
/// # Ok::<(), hotverbs::Error>(())
/// ```
pub fn take_drop_errors() -> Vec<Error> {
    match DROP_ERRORS.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_verb_errno_and_hint() {
        let e = Error::new("ibv_modify_qp(INIT->RTR)", libc::EINVAL)
            .with_hint("path_mtu above port's active_mtu 1024?");
        assert_eq!(
            e.to_string(),
            "ibv_modify_qp(INIT->RTR): EINVAL — path_mtu above port's active_mtu 1024?"
        );
    }

    #[test]
    fn negative_return_uses_errno() {
        hotverbs_ffi::set_errno(libc::EAGAIN);
        let e = Error::from_ret("ibv_get_cq_event", -1);
        assert_eq!(e.errno, libc::EAGAIN);
        let e = Error::from_ret("ibv_modify_qp", libc::EINVAL);
        assert_eq!(e.errno, libc::EINVAL);
    }

    #[test]
    fn zero_errno_is_not_success() {
        let e = Error::new("ibv_alloc_pd", 0);
        assert_eq!(e.errno, libc::EIO);
    }

    #[test]
    fn generic_hints() {
        let e = Error::from_ret("ibv_reg_mr", libc::ENOMEM);
        assert!(e.hint.as_deref().unwrap().contains("ulimit -l"), "{e}");
        let e = Error::from_ret("ibv_dealloc_pd", libc::EBUSY);
        assert!(e.to_string().contains("drop them first"), "{e}");
    }
}
