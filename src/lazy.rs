//! A function pointer found on first use and kept: the one way the shim holds a real function
//! (the hooks' real functions, glibc's `dlsym`, `dlclose`, `exec*`, `_exit`).
//!
//! Lock-free and allocation-free (an atomic slot), so it is safe inside `dlsym`, signal handlers
//! and while a malloc wrapper is on the stack. A lookup that finds nothing is retried next time
//! (the library may be loaded later); the first pointer stored wins.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

pub struct LazyFn(AtomicPtr<c_void>);

impl LazyFn {
    pub const fn new() -> Self {
        LazyFn(AtomicPtr::new(null_mut()))
    }

    /// The pointer, looked up with `find` if not known yet (null if still not found).
    pub fn get_or(&self, find: impl FnOnce() -> *mut c_void) -> *mut c_void {
        let p = self.0.load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let found = find();
        if found.is_null() {
            return found;
        }
        match self.0.compare_exchange(null_mut(), found, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => found,
            Err(winner) => winner,
        }
    }

    /// The pointer typed as `F`, looked up with `find` if not known yet.
    ///
    /// # Safety
    /// `F` must be the function pointer type of what `find` finds.
    pub unsafe fn typed<F: Copy>(&self, find: impl FnOnce() -> *mut c_void) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
        let p = self.get_or(find);
        // SAFETY: `F` is a function pointer type (caller's contract) and `p` is non-null.
        (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// The pointer if known, with no lookup.
    pub fn known(&self) -> *mut c_void {
        self.0.load(Ordering::Acquire)
    }

    /// Records `p` as the pointer unless another one is known already; says whether `p` is it.
    pub fn learn(&self, p: *mut c_void) -> bool {
        match self.0.compare_exchange(null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(existing) => existing == p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_that_fails_is_retried_and_the_first_found_pointer_stays() {
        let slot = LazyFn::new();
        assert!(slot.get_or(null_mut).is_null());
        assert!(slot.known().is_null());
        let a = 0x1000 as *mut c_void;
        let b = 0x2000 as *mut c_void;
        assert_eq!(slot.get_or(|| a), a);
        assert_eq!(slot.get_or(|| b), a, "a found pointer is kept");
        assert!(slot.learn(a));
        assert!(!slot.learn(b), "a different pointer is refused");
        // SAFETY: never called; only the conversion is tested.
        let f = unsafe { slot.typed::<extern "C" fn()>(null_mut) };
        assert_eq!(f.map(|f| f as usize), Some(0x1000));
    }
}
