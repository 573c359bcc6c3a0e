//! `ibv_get_device_list(3)` with the one rule that matters on machines without RDMA: a NULL
//! return with `errno == ENOSYS` (kernel without the uverbs ABI, e.g. this CI machine) means
//! "no devices", not an error.

use core::ffi::CStr;

use crate::generated::types::ibv_device;
use crate::IbvFns;

/// An owned device list; freed with `ibv_free_device_list` on drop.
///
/// Invariant: `list` is NULL or came from `fns.ibv_get_device_list` and holds `len` device
/// pointers then a NULL; `fns` is one provider's whole table ([`DeviceList::get`]'s
/// contract), so `fns.ibv_free_device_list` is the free that matches it.
pub struct DeviceList<'f> {
    fns: &'f IbvFns,
    list: *mut *mut ibv_device,
    len: usize,
}

impl<'f> DeviceList<'f> {
    /// Lists the RDMA devices.
    ///
    /// `unsafe` because the table is trusted: `IbvFns` is a plain `Copy` struct with public
    /// fields, so safe code could pair one provider's `ibv_get_device_list` with another's
    /// `ibv_free_device_list`, which the drop would then call on a list it never made.
    /// Calling it from safe code does not compile:
    /// ```compile_fail,E0133
    /// let fns = hotverbs_ffi::IbvFns::EMPTY;
    /// let _ = hotverbs_ffi::device_list::DeviceList::get(&fns);
    /// ```
    ///
    /// # Safety
    /// `fns` is one provider's complete table as returned by the loader
    /// ([`ibverbs()`](crate::ibverbs)) or a software device's `verbs_table()`, not assembled
    /// from several: the list it returns is freed with the same table's
    /// `ibv_free_device_list`, and its entries are read as `ibv_device`s.
    ///
    /// # Errors
    /// The errno of a failed `ibv_get_device_list` other than ENOSYS (which is an empty
    /// list), or ENOSYS when the table lacks the symbol.
    ///
    /// # References
    /// `ibv_get_device_list(3)`
    pub unsafe fn get(fns: &'f IbvFns) -> Result<Self, i32> {
        let Some(get) = fns.ibv_get_device_list else {
            return Err(libc::ENOSYS);
        };
        let mut n: core::ffi::c_int = 0;
        crate::set_errno(0);
        // SAFETY: n is a valid out-pointer; the function is libibverbs' (or a software
        // device's) ibv_get_device_list (caller's contract: one provider's whole table).
        let list = unsafe { get(&mut n) };
        if list.is_null() {
            let e = crate::errno();
            return if e == libc::ENOSYS {
                Ok(DeviceList { fns, list, len: 0 })
            } else {
                Err(if e == 0 { libc::ENOMEM } else { e })
            };
        }
        Ok(DeviceList {
            fns,
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No devices?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw device pointer at `i` (valid while the list lives, or after opening it).
    pub fn get_raw(&self, i: usize) -> Option<*mut ibv_device> {
        if i < self.len {
            // SAFETY: the list holds `len` valid entries (plus a NULL terminator).
            Some(unsafe { *self.list.add(i) })
        } else {
            None
        }
    }

    /// Device name at `i` (`ibv_get_device_name(3)`, read from the struct).
    pub fn name(&self, i: usize) -> Option<&CStr> {
        let dev = self.get_raw(i)?;
        // SAFETY: dev is a valid ibv_device; `name` is a NUL-terminated array in it.
        Some(unsafe { CStr::from_ptr((*dev).name.as_ptr()) })
    }
}

impl core::fmt::Debug for DeviceList<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut l = f.debug_list();
        for i in 0..self.len {
            l.entry(&self.name(i));
        }
        l.finish()
    }
}

impl Drop for DeviceList<'_> {
    fn drop(&mut self) {
        if self.list.is_null() {
            return;
        }
        if let Some(free) = self.fns.ibv_free_device_list {
            // SAFETY: list came from this table's ibv_get_device_list and is freed once; the
            // table is one provider's (`get`'s contract), so this is the matching free.
            unsafe { free(self.list) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn enosys(n: *mut core::ffi::c_int) -> *mut *mut ibv_device {
        // SAFETY: n is the caller's valid out-pointer.
        unsafe { *n = 0 };
        crate::set_errno(libc::ENOSYS);
        core::ptr::null_mut()
    }

    unsafe extern "C" fn eperm(_n: *mut core::ffi::c_int) -> *mut *mut ibv_device {
        crate::set_errno(libc::EPERM);
        core::ptr::null_mut()
    }

    #[test]
    fn enosys_is_no_devices() {
        let mut fns = IbvFns::EMPTY;
        fns.ibv_get_device_list = Some(enosys);
        // SAFETY: a table whose only list verb is `enosys`: no list is made, none is freed.
        let l = unsafe { DeviceList::get(&fns) }.expect("ENOSYS must mean an empty list");
        assert!(l.is_empty());
        assert_eq!(std::format!("{l:?}"), "[]");
        assert!(l.get_raw(0).is_none());
    }

    #[test]
    fn other_errors_are_errors() {
        let mut fns = IbvFns::EMPTY;
        fns.ibv_get_device_list = Some(eperm);
        // SAFETY: `eperm` makes no list, so nothing is freed.
        assert_eq!(unsafe { DeviceList::get(&fns) }.err(), Some(libc::EPERM));
        // SAFETY: the empty table has no list verb at all.
        let none = unsafe { DeviceList::get(&IbvFns::EMPTY) };
        assert_eq!(none.err(), Some(libc::ENOSYS));
    }

    #[test]
    fn real_libibverbs_lists_without_crashing() {
        // On this CI machine the kernel has no RDMA: libibverbs answers ENOSYS and the list
        // is empty. Inside the rxe VM it lists rxe0. Either way: no error, no crash.
        let Ok(fns) = crate::ibverbs() else {
            std::eprintln!("skipped: libibverbs.so.1 not installed");
            return;
        };
        // SAFETY: the loader's table, whole.
        let l = unsafe { DeviceList::get(fns) }.expect("device listing failed");
        for i in 0..l.len() {
            assert!(!l.name(i).unwrap().to_bytes().is_empty());
        }
        if std::env::var_os("HOTVERBS_RXE").is_some() {
            assert!(!l.is_empty(), "inside the rxe VM rxe0 must be listed");
        }
    }
}
