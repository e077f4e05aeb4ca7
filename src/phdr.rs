//! The one walk over the loaded objects (`dl_iterate_phdr`): the module list, the unwinder's
//! snapshot and our `RTLD_NEXT` emulation all read the loader's view through it.
//!
//! The walk allocates nothing and takes no lock but the loader's own (recursive) one, so
//! `dlsym` may use it while a malloc wrapper is on the stack. A panic in a visitor stops the
//! walk instead of unwinding into the loader.

use std::ffi::{c_int, c_void, CStr};
use std::ops::ControlFlow;

/// One loaded object as the loader describes it, borrowed for the duration of a visit.
pub struct Loaded<'a> {
    /// Position in load order (0: the main program).
    pub index: usize,
    /// The loader's name for it: empty for the main program (and the vDSO on some systems).
    pub name: &'a CStr,
    /// Load bias (`dlpi_addr`): runtime address = bias + `p_vaddr`.
    pub bias: u64,
    pub phdrs: &'a [libc::Elf64_Phdr],
    /// The loader's counters of objects loaded and unloaded so far.
    pub adds: u64,
    pub subs: u64,
}

impl Loaded<'_> {
    /// Runtime ranges of the PT_LOAD segments, with whether each is executable.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.phdrs.iter().filter(|ph| ph.p_type == libc::PT_LOAD).map(|ph| {
            let start = self.bias.wrapping_add(ph.p_vaddr);
            (start, start.wrapping_add(ph.p_memsz), ph.p_flags & libc::PF_X != 0)
        })
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.segments().any(|(s, e, _)| addr >= s && addr < e)
    }

    /// The runtime address and size of the first program header of `kind`.
    pub fn header(&self, kind: u32) -> Option<(u64, u64)> {
        self.phdrs.iter().find(|ph| ph.p_type == kind).map(|ph| (self.bias.wrapping_add(ph.p_vaddr), ph.p_memsz))
    }
}

type Visitor<'v> = &'v mut dyn FnMut(&Loaded) -> ControlFlow<()>;

/// Visits the loaded objects in load order until `visit` breaks.
pub fn each_loaded(mut visit: impl FnMut(&Loaded) -> ControlFlow<()>) {
    let mut state: (Visitor, usize) = (&mut visit, 0);
    // SAFETY: the callback reads what the loader hands it during the call and `state`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(trampoline), &mut state as *mut (Visitor, usize) as *mut c_void) };
}

unsafe extern "C" fn trampoline(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the state of `each_loaded`; `info` is valid during the call.
    let ((visit, index), info) = unsafe { (&mut *(data as *mut (Visitor, usize)), &*info) };
    let phdrs = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers while the object is loaded.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
    };
    // SAFETY: the loader's names are NUL-terminated strings.
    let name = if info.dlpi_name.is_null() { c"" } else { unsafe { CStr::from_ptr(info.dlpi_name) } };
    let loaded = Loaded { index: *index, name, bias: info.dlpi_addr, phdrs, adds: info.dlpi_adds, subs: info.dlpi_subs };
    *index += 1;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(&loaded))) {
        Ok(ControlFlow::Continue(())) => 0,
        _ => 1,
    }
}

/// The loader's counters of objects loaded and unloaded (`dlpi_adds`, `dlpi_subs`), from the
/// first object only: cheap enough to ask before trusting a cached view.
pub fn loader_counters() -> (u64, u64) {
    let mut c = (0, 0);
    each_loaded(|o| {
        c = (o.adds, o.subs);
        ControlFlow::Break(())
    });
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_visits_the_main_program_first_and_stops_when_asked() {
        let here = the_walk_visits_the_main_program_first_and_stops_when_asked as fn() as usize as u64;
        let mut seen = Vec::new();
        each_loaded(|o| {
            seen.push((o.index, o.name.to_bytes().is_empty(), o.contains(here)));
            ControlFlow::Continue(())
        });
        assert!(seen.len() > 1);
        assert_eq!(seen[0].0, 0);
        assert!(seen[0].1, "the main program has no loader name");
        assert!(seen.iter().any(|s| s.2));
        let mut visits = 0;
        each_loaded(|_| {
            visits += 1;
            ControlFlow::Break(())
        });
        assert_eq!(visits, 1);
        let (adds, subs) = loader_counters();
        assert!(adds >= seen.len() as u64 && subs <= adds);
    }

    #[test]
    fn a_panicking_visitor_stops_the_walk_instead_of_unwinding_into_the_loader() {
        let mut visits = 0;
        each_loaded(|_| {
            visits += 1;
            panic!("visitor");
        });
        assert_eq!(visits, 1);
    }
}
