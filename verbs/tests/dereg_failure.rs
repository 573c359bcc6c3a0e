//! `ibv_dereg_mr` failing in `Mr::destroy` or `Mr::drop`: the error is reported, and an
//! owned buffer is leaked (left mapped) rather than unmapped while the device may still
//! have it registered. Its own test binary: the drop-error record is process-wide.

use std::ffi::c_int;

use hotverbs::*;
use hotverbs_ffi::{ibv_mr, IbvFns};

/// A device whose `ibv_dereg_mr` always fails (as with memory windows still bound), and
/// so leaves the MR registered.
unsafe extern "C" fn dereg_busy(_mr: *mut ibv_mr) -> c_int {
    libc::EBUSY
}

/// softnic's table with the failing `ibv_dereg_mr`, and a softnic context reached
/// through it.
fn failing_context() -> Context {
    let mut table: IbvFns = *hotverbs_softnic::verbs_table();
    table.ibv_dereg_mr = Some(dereg_busy);
    let fns: &'static IbvFns = Box::leak(Box::new(table));
    let mut n = 0;
    // SAFETY: softnic's device list; freed below after opening its first device.
    let ctx = unsafe {
        let list = fns.ibv_get_device_list.unwrap()(&mut n);
        assert!(n >= 1 && !list.is_null());
        let ctx = fns.ibv_open_device.unwrap()(*list);
        fns.ibv_free_device_list.unwrap()(list);
        ctx
    };
    assert!(!ctx.is_null());
    // SAFETY: ctx is a live softnic context reached through `fns` (the same functions
    // except dereg), never closed: it outlives every object made from it.
    unsafe { Context::from_raw_borrowed(fns, ctx) }
}

/// Is `[addr, addr + len)` still mapped? (`mincore` fails with ENOMEM on unmapped pages.)
fn mapped(addr: *mut u8, len: usize) -> bool {
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: mincore only inspects the page tables; vec has one byte per page.
    unsafe { libc::mincore(addr.cast(), len, vec.as_mut_ptr()) == 0 }
}

#[test]
fn failed_dereg_leaks_the_owned_buffer() {
    let ctx = failing_context();
    let pd = ctx.alloc_pd().unwrap();

    // destroy(): the error comes back, the buffer stays mapped.
    let mut mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_from(0, b"still here").unwrap();
    let (addr, len) = (mr.as_ptr(), mr.len());
    let e = mr.destroy().unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_dereg_mr", libc::EBUSY));
    assert!(e.to_string().contains("leaked"), "{e}");
    assert!(mapped(addr, len), "the buffer must not be unmapped");
    // SAFETY: the leaked mapping is never unmapped and nothing else writes it.
    let kept = unsafe { std::slice::from_raw_parts(addr, 10) };
    assert_eq!(kept, b"still here");

    // drop: recorded as a drop error, buffer also kept.
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let (addr, len) = (mr.as_ptr(), mr.len());
    assert!(take_drop_errors().is_empty());
    drop(mr);
    let errs = take_drop_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        (errs[0].verb(), errs[0].errno()),
        ("ibv_dereg_mr", libc::EBUSY)
    );
    assert!(mapped(addr, len));

    // A borrowed buffer goes back to its owner (documented): the error is still reported.
    let mut mine = vec![0u8; 64];
    let mr = pd.reg_mr(&mut mine, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.destroy().unwrap_err().errno(), libc::EBUSY);
    mine[0] = 1;
    assert_eq!(mine[0], 1);
}
