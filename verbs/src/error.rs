//! The error type of the crate: which verb failed, with which errno, and what to try; and
//! [`RecvPostError`], a receive ring's refused post with the QP's state (it converts into
//! an [`Error`]).

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
///
/// The fields are private (read them with [`verb`](Error::verb), [`errno`](Error::errno) and
/// [`hint`](Error::hint)), so the error can carry more context later without breaking
/// callers.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    /// The verb, e.g. `"ibv_create_qp"` or `"ibv_modify_qp(INIT->RTR)"`.
    verb: &'static str,
    /// The errno value (positive), e.g. `libc::EINVAL`.
    errno: i32,
    /// What to check or do, when we can tell.
    hint: Option<Cow<'static, str>>,
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

    /// The verb that failed, as its man page names it, e.g. `"ibv_create_qp"` or
    /// `"ibv_modify_qp(INIT->RTR)"`.
    ///
    /// # Example
    /// ```
    /// let e = hotverbs::Error::new("ibv_alloc_pd", libc::ENOMEM);
    /// assert_eq!(e.verb(), "ibv_alloc_pd");
    /// ```
    pub fn verb(&self) -> &'static str {
        self.verb
    }

    /// The errno value (positive, never 0), e.g. `libc::EINVAL`.
    ///
    /// # Example
    /// ```
    /// assert_eq!(hotverbs::Error::new("ibv_alloc_pd", -libc::ENOMEM).errno(), libc::ENOMEM);
    /// assert_eq!(hotverbs::Error::new("ibv_alloc_pd", 0).errno(), libc::EIO);
    /// ```
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// What to check or do, when we can tell.
    ///
    /// # Example
    /// ```
    /// let e = hotverbs::Error::new("ibv_reg_mr", libc::EACCES).with_hint("add LOCAL_WRITE");
    /// assert_eq!(e.hint(), Some("add LOCAL_WRITE"));
    /// assert_eq!(hotverbs::Error::new("ibv_reg_mr", libc::EACCES).hint(), None);
    /// ```
    pub fn hint(&self) -> Option<&str> {
        self.hint.as_deref()
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

    /// The errno as a [`std::io::ErrorKind`], classified as the standard library classifies
    /// OS errors: `ENOENT` is `NotFound`, `EAGAIN` `WouldBlock`, `EINVAL` `InvalidInput`,
    /// `ETIMEDOUT` `TimedOut`, ... It is also the kind of the `io::Error` this error
    /// converts into.
    ///
    /// # Example
    /// ```
    /// let e = hotverbs::Error::new("rdma_get_cm_event", libc::ETIMEDOUT);
    /// assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    /// ```
    pub fn kind(&self) -> std::io::ErrorKind {
        std::io::Error::from_raw_os_error(self.errno).kind()
    }

    /// The errno carried by an `io::Error`: its OS code, or the errno of a hotverbs
    /// [`Error`] inside it (what `From<Error> for io::Error` builds). `None` for other
    /// errors.
    ///
    /// # Example
    /// ```
    /// let io = std::io::Error::from(hotverbs::Error::new("ibv_reg_mr", libc::ENOMEM));
    /// assert_eq!(hotverbs::Error::errno_of(&io), Some(libc::ENOMEM));
    /// let os = std::io::Error::from_raw_os_error(libc::EBADF);
    /// assert_eq!(hotverbs::Error::errno_of(&os), Some(libc::EBADF));
    /// assert_eq!(hotverbs::Error::errno_of(&std::io::Error::other("x")), None);
    /// ```
    pub fn errno_of(e: &std::io::Error) -> Option<i32> {
        e.raw_os_error()
            .or_else(|| Some(e.get_ref()?.downcast_ref::<Error>()?.errno))
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

/// Keeps the errno's meaning and the verb's context: the `io::Error`'s [`kind`] is the
/// errno's (as [`Error::kind`] gives it, so `EAGAIN` is [`WouldBlock`] — what tokio's
/// `AsyncFd::try_io` and other readiness loops look for), its message is this error's
/// `Display` (verb, errno name, hint), and the [`Error`] itself is the inner error
/// (`get_ref`/`into_inner` + `downcast`).
///
/// `std::io::Error` holds either an OS code or a kind with an inner error, never both, so
/// [`raw_os_error`] is `None` here; [`Error::errno_of`] reads the errno back from either
/// form. (`io::Error::from_raw_os_error(errno)` would keep `raw_os_error` but drop the
/// verb and the hint, which are what make the message actionable.)
///
/// # Example
/// ```
/// use std::io::ErrorKind;
/// let e = hotverbs::Error::new("ibv_get_cq_event", libc::EAGAIN);
/// let io: std::io::Error = e.clone().into();
/// assert_eq!(io.kind(), ErrorKind::WouldBlock);
/// assert_eq!(hotverbs::Error::errno_of(&io), Some(libc::EAGAIN));
/// assert_eq!(io.get_ref().and_then(|i| i.downcast_ref::<hotverbs::Error>()), Some(&e));
/// assert_eq!(io.to_string(), "ibv_get_cq_event: EAGAIN");
/// ```
///
/// [`kind`]: std::io::Error::kind
/// [`WouldBlock`]: std::io::ErrorKind::WouldBlock
/// [`raw_os_error`]: std::io::Error::raw_os_error
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        std::io::Error::new(e.kind(), e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A [`RecvRing`](crate::RecvRing)'s refused post ([`fill`](crate::RecvRing::fill), or
/// [`explain`](crate::RecvRing::explain) of a `repost` error): the datapath's
/// [`PostError`](hotverbs_datapath::PostError) (its fields through `Deref`:
/// `e.verb`, `e.errno`, `e.first_rejected`, ...) and the QP's state when it was refused,
/// which the message names when it is the cause.
///
/// Converts into an [`Error`] of the post verb with the same hint.
///
/// # Example
/// ```
/// use hotverbs::*;
/// let ctx = Context::open("softnic")?;
/// let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
/// let qp = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build()?;
/// let mut region = pd.alloc_mr(256, AccessFlags::LOCAL_WRITE)?;
/// let mut rx = qp.recv_ring::<4>(&mut region, 0, RecvConfig::new(0, 64, 4))?;
/// let e = rx.fill().unwrap_err(); // still in RESET
/// assert_eq!((e.verb, e.errno, e.state()), ("ibv_post_recv", libc::EINVAL, QpState::Reset));
/// assert!(e.to_string().contains("call Qp::init() (or connect) first"), "{e}");
/// rx.reset_qp()?; // requeues what the provider may have taken (rxe counts it posted)
/// qp.init(&ctx.port_info(None, None)?, &ConnectOptions::default())?;
/// assert_eq!(rx.fill()?, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvPostError {
    post: hotverbs_datapath::PostError,
    state: crate::QpState,
}

impl RecvPostError {
    pub(crate) fn new(post: hotverbs_datapath::PostError, state: crate::QpState) -> Self {
        RecvPostError { post, state }
    }

    /// The datapath's error.
    pub fn post(&self) -> &hotverbs_datapath::PostError {
        &self.post
    }

    /// The QP's state when the post was refused (`ibv_query_qp`, else the tracked state).
    pub fn state(&self) -> crate::QpState {
        self.state
    }

    /// What to do (the hint the [`Error`] conversion carries).
    pub fn hint(&self) -> String {
        crate::qp::post_hint(self.state, &self.post, false, "RecvRing")
    }
}

impl std::ops::Deref for RecvPostError {
    type Target = hotverbs_datapath::PostError;
    fn deref(&self) -> &hotverbs_datapath::PostError {
        &self.post
    }
}

impl fmt::Display for RecvPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.post;
        write!(
            f,
            "{} failed with {} ({}) ",
            p.verb,
            hotverbs_ffi::errno_name(p.errno),
            p.errno
        )?;
        if p.first_rejected == hotverbs_datapath::PostError::UNKNOWN {
            write!(
                f,
                "without naming the rejected WR (chain from slot {})",
                p.first_rejected_seq
            )?;
        } else {
            write!(
                f,
                "at WR {} of the chain (slot {})",
                p.first_rejected, p.first_rejected_seq
            )?;
        }
        write!(f, ": {}", self.hint())
    }
}

impl std::error::Error for RecvPostError {}

impl From<RecvPostError> for hotverbs_datapath::PostError {
    fn from(e: RecvPostError) -> Self {
        e.post
    }
}

impl From<RecvPostError> for Error {
    fn from(e: RecvPostError) -> Self {
        Error::new(e.post.verb, e.post.errno).with_hint(e.hint())
    }
}

static DROP_ERRORS: Mutex<Vec<Error>> = Mutex::new(Vec::new());

/// Records a destroy verb that failed inside `Drop` (where it cannot be returned): logged
/// through the `log` facade at `warn` level (target `hotverbs::error`) and kept for
/// [`take_drop_errors`].
pub(crate) fn record_drop_error(e: Error) {
    log::warn!("hotverbs: destroy failed during drop: {e}");
    if let Ok(mut v) = DROP_ERRORS.lock() {
        if v.len() < 1024 {
            v.push(e);
        }
    }
}

/// Destroy failures that happened in `Drop` since the last call (oldest first).
///
/// Every object also has an explicit `destroy(self) -> Result<()>` (or `close`) that returns
/// the verb's error instead; `Drop` can only report it.
///
/// The primary channel for that report is the [`log`](https://docs.rs/log) facade: each
/// failure is a `warn!` record (target `hotverbs::error`, message
/// `hotverbs: destroy failed during drop: <error>`), which reaches whatever logger the
/// application installed (`env_logger`, `tracing`'s log bridge, ...) and goes nowhere if it
/// installed none. This list is the secondary channel, for code that wants the errors
/// themselves: a test, or a long-running program checking that teardown was clean. It is
/// process-wide, keeps at most 1024 errors until taken, and is emptied by each call.
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
    fn io_error_kind_follows_errno_and_keeps_the_error() {
        use std::io::ErrorKind;
        for (errno, kind) in [
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EAGAIN, ErrorKind::WouldBlock),
            (libc::EINVAL, ErrorKind::InvalidInput),
            (libc::ETIMEDOUT, ErrorKind::TimedOut),
            (libc::EPERM, ErrorKind::PermissionDenied),
        ] {
            let e = Error::new("ibv_modify_qp(INIT->RTR)", errno).with_hint("a hint");
            assert_eq!(e.kind(), kind, "{e}");
            let io = std::io::Error::from(e.clone());
            assert_eq!(io.kind(), kind, "{e}");
            // The message and the inner error are ours: verb, errno name and hint survive.
            assert_eq!(io.to_string(), e.to_string());
            assert!(io.to_string().contains("a hint"), "{io}");
            assert_eq!(Error::errno_of(&io), Some(errno));
            assert_eq!(io.raw_os_error(), None);
            let inner = io.into_inner().expect("an inner error");
            assert_eq!(inner.downcast_ref::<Error>(), Some(&e));
        }
        // An errno without a dedicated kind still converts, with its errno recoverable.
        let io = std::io::Error::from(Error::new("ibv_post_send", libc::EIO));
        assert_eq!(
            io.kind(),
            std::io::Error::from_raw_os_error(libc::EIO).kind()
        );
        assert_eq!(Error::errno_of(&io), Some(libc::EIO));
        assert_eq!(Error::errno_of(&std::io::Error::other("not ours")), None);
    }

    /// A logger that keeps the records of this crate (installed once for the unit-test
    /// binary; only `drop_errors_go_to_the_log_facade` installs one).
    struct Capture(Mutex<Vec<(log::Level, String, String)>>);

    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, r: &log::Record<'_>) {
            if let Ok(mut v) = self.0.lock() {
                v.push((r.level(), r.target().to_string(), r.args().to_string()));
            }
        }
        fn flush(&self) {}
    }

    static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

    #[test]
    fn drop_errors_go_to_the_log_facade() {
        log::set_logger(&CAPTURE).expect("the only logger of this test binary");
        log::set_max_level(log::LevelFilter::Trace);
        // A distinctive verb, so records of other tests running in parallel do not match.
        let e = Error::new("ibv_destroy_qp(log-facade-test)", libc::EBUSY);
        record_drop_error(e.clone());
        let got = CAPTURE.0.lock().unwrap().clone();
        let ours: Vec<_> = got
            .iter()
            .filter(|(_, _, m)| m.contains("log-facade-test"))
            .collect();
        assert_eq!(ours.len(), 1, "{got:?}");
        let (level, target, msg) = ours[0];
        assert_eq!(*level, log::Level::Warn);
        assert_eq!(target, "hotverbs::error");
        assert_eq!(
            msg,
            &format!("hotverbs: destroy failed during drop: {e}"),
            "{msg}"
        );
        // The secondary channel still has it (other tests may have added theirs).
        assert!(take_drop_errors().contains(&e));
    }

    #[test]
    fn generic_hints() {
        let e = Error::from_ret("ibv_reg_mr", libc::ENOMEM);
        assert!(e.hint.as_deref().unwrap().contains("ulimit -l"), "{e}");
        let e = Error::from_ret("ibv_dealloc_pd", libc::EBUSY);
        assert!(e.to_string().contains("drop them first"), "{e}");
    }
}

/// A refused [`Qp::post_send_chain`](crate::Qp::post_send_chain): the error, and the
/// index of the first WR of the chain that was not posted. Every WR before it was posted
/// (and runs); none from it on. `None` when the provider named no WR (`*bad_wr` NULL: rxe
/// before RTS, fault-truth S1, which queues the whole chain anyway): any WR of the chain
/// may still run once the QP is in RTS, so its memory stays in use until the QP is reset.
///
/// Converts into its [`Error`] (`?` in a function returning [`Result`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainError {
    /// The verb, errno and hint, as for the WR alone.
    pub error: Error,
    /// The first WR not posted, or `None` when the provider did not say.
    pub first_rejected: Option<usize>,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.first_rejected {
            Some(i) => write!(f, "WR {i} of the chain (WRs before it were posted): ")?,
            None => write!(f, "a WR of the chain (the provider named none): ")?,
        }
        write!(f, "{}", self.error)
    }
}

impl std::error::Error for ChainError {}

impl From<ChainError> for Error {
    fn from(e: ChainError) -> Error {
        e.error
    }
}
