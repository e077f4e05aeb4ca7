//! Finding real functions: the real `dlsym`, the next definition of a hooked symbol, an
//! emulation of `RTLD_NEXT` for our callers, and the driver's current device.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};

use std::ops::ControlFlow;

use crate::modules::{loaded_objects, Object};
use crate::lazy::LazyFn;
use crate::phdr::each_loaded;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: LazyFn = LazyFn::new();

/// glibc's own `dlsym`. We export `dlsym` ourselves, so it is looked up by version: glibc 2.34+
/// has it in libc as GLIBC_2.34, older ones in libdl as GLIBC_2.2.5. Found when this library is
/// loaded ([`init`]), so that no `dlsym` of the program's pays the lookup (`dlvsym` resets
/// `dlerror`'s state).
pub fn real_dlsym_fn() -> Option<DlsymFn> {
    let find = || {
        [c"GLIBC_2.34", c"GLIBC_2.2.5"]
            .iter()
            // SAFETY: plain dlvsym call with NUL-terminated strings.
            .map(|version| unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) })
            .find(|p| !p.is_null())
            .unwrap_or(null_mut())
    };
    // SAFETY: what `find` finds is glibc's dlsym, whose type is DlsymFn.
    unsafe { REAL_DLSYM.typed(find) }
}

/// Run from this library's constructor: looks up what `dlsym` needs before the program runs.
pub fn init() {
    let _ = real_dlsym_fn();
}

/// Calls glibc's `dlsym`. Note: `RTLD_NEXT` here means "after this library".
pub fn dlsym_real(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym_fn() {
        // SAFETY: forwarding a handle the caller got from the loader and a C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => null_mut(),
    }
}

/// A lookup of the tracer's own (not the program's `dlsym`): a miss leaves no `dlerror` message
/// behind, or the program's next `dlerror()` would report it (a runtime that checks `dlerror()`
/// after its own lookups, made inside our hook, takes it for its failure).
pub fn dlsym_quiet(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let p = dlsym_real(handle, name);
    if p.is_null() {
        // SAFETY: dlerror takes no arguments; it consumes the message the miss left.
        unsafe { libc::dlerror() };
    }
    p
}

/// Whether `p` lies in this library. From our own program headers (found through the
/// linker's `__ehdr_start`), so it takes no loader lock: `dlsym` asks it.
pub fn is_ours(p: *const c_void) -> bool {
    let (start, end) = own_range();
    let p = p as usize;
    p >= start && p < end
}

extern "C" {
    /// The ELF header of this library, defined by the linker (hidden: always ours).
    static __ehdr_start: u8;
}

/// This library's mapped address range, from its PT_LOAD segments.
fn own_range() -> (usize, usize) {
    // SAFETY: `__ehdr_start` is this object's ELF header, mapped with its program headers
    // (the first PT_LOAD holds both); the reads stay inside the header and the phdr table.
    unsafe {
        let base = std::ptr::addr_of!(__ehdr_start) as usize;
        let ehdr = &*(base as *const libc::Elf64_Ehdr);
        let phdrs = (base + ehdr.e_phoff as usize) as *const libc::Elf64_Phdr;
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for i in 0..ehdr.e_phnum as usize {
            let ph = &*phdrs.add(i);
            if ph.p_type == libc::PT_LOAD {
                lo = lo.min(ph.p_vaddr as usize);
                hi = hi.max(ph.p_vaddr.wrapping_add(ph.p_memsz) as usize);
            }
        }
        if lo > hi {
            return (0, 0);
        }
        // The header is at the bias plus the first segment's address (0 for a shared object).
        let bias = base.wrapping_sub(lo);
        (bias.wrapping_add(lo), bias.wrapping_add(hi))
    }
}

/// Looks `name` up in one loaded object (by its own handle: the object, then its dependencies).
pub fn lookup_in(obj: &Object, name: &CStr) -> *mut c_void {
    let Ok(path) = std::ffi::CString::new(obj.path.as_str()) else { return null_mut() };
    // SAFETY: RTLD_NOLOAD only returns a handle for an object that is already loaded (and
    // takes a reference we drop right after); the main program is opened with a null path.
    unsafe {
        let h = libc::dlopen(if obj.is_main { std::ptr::null() } else { path.as_ptr() }, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            libc::dlerror(); // no message left for the program (see `dlsym_quiet`)
            return null_mut();
        }
        let p = dlsym_quiet(h, name);
        libc::dlclose(h);
        p
    }
}

/// The next definition of `name` (see [`next_definition`]) typed as `F`, kept in `slot`.
///
/// # Safety
/// `F` must be the function pointer type of `name`, and `slot` used for `name` only.
pub unsafe fn next_fn<F: Copy>(slot: &LazyFn, name: &CStr) -> Option<F> {
    // SAFETY: per the contract.
    unsafe { slot.typed(|| next_definition(name)) }
}

/// The definition of `name` that our hook stands in front of: the next one after this library
/// in global lookup order, or, for libraries opened with RTLD_LOCAL (cudart opening libcuda,
/// Python extensions opening libcudart), the one in any loaded object other than us.
pub fn next_definition(name: &CStr) -> *mut c_void {
    let p = dlsym_quiet(libc::RTLD_NEXT, name);
    if !p.is_null() && !is_ours(p) {
        return p;
    }
    for obj in loaded_objects() {
        let q = lookup_in(&obj, name);
        if !q.is_null() && !is_ours(q) {
            return q;
        }
    }
    null_mut()
}

/// `dlsym(RTLD_NEXT, name)` as seen from `caller` (a return address in the calling object): the
/// first definition in an object loaded after the caller's, in load order. `None` when the
/// caller's object is unknown or no later object defines `name` in a way read here (versioned
/// twice, TLS, IFUNC): then only glibc's own `dlsym` can answer. Forwarding `RTLD_NEXT` to
/// glibc from here would search after *this* library instead.
///
/// `dlsym` calls this, so a malloc wrapper may be on the stack: it allocates nothing, takes no
/// lock of ours and leaves `dlerror` alone (it reads the objects' own symbol tables instead of
/// opening them; `dl_iterate_phdr` takes only the loader's recursive lock).
pub fn next_after(caller: *const c_void, name: &CStr) -> Option<*mut c_void> {
    let (caller, name) = (caller as u64, name.to_bytes());
    let mut seen_caller = false;
    // `Some(None)`: the answer is glibc's to give (stop looking).
    let mut found: Option<Option<*mut c_void>> = None;
    each_loaded(|o| {
        if !seen_caller {
            seen_caller = o.contains(caller);
            return ControlFlow::Continue(());
        }
        // SAFETY: the object is loaded (we are inside the loader's walk), its tables are mapped.
        match unsafe { elf_lookup(o.bias, o.phdrs, name) } {
            Lookup::Found(p) => found = Some(Some(p)),
            Lookup::Unreadable => found = Some(None),
            Lookup::Absent => return ControlFlow::Continue(()),
        }
        ControlFlow::Break(())
    });
    found.flatten()
}

/// What one object's dynamic symbol table says of a name.
#[derive(Debug, PartialEq)]
enum Lookup {
    Found(*mut c_void),
    Absent,
    /// Defined in a way this reader does not resolve (TLS, IFUNC, absolute, no hash table).
    Unreadable,
}

/// An entry of the dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct Elf64Dyn {
    d_tag: i64,
    d_un: u64,
}

const DT_GNU_HASH: u64 = 0x6fff_fef5;
const DT_VERSYM: u64 = 0x6fff_fff0;

/// Looks `name` up in the dynamic symbol table of the object loaded at `bias` with `phdrs`, as
/// glibc's unversioned `dlsym` would within that one object: a defined global or weak symbol,
/// its unversioned or default-version definition. Allocates nothing.
///
/// # Safety
/// `bias` and `phdrs` describe an object that stays loaded during the call.
unsafe fn elf_lookup(bias: u64, phdrs: &[libc::Elf64_Phdr], name: &[u8]) -> Lookup {
    let Some(dynamic) = phdrs.iter().find(|ph| ph.p_type == libc::PT_DYNAMIC) else { return Lookup::Absent };
    // The loader rewrites most dynamic entries to addresses; some (the vDSO, read-only dynamic
    // sections) keep offsets.
    let addr = |v: u64| if v < bias { v.wrapping_add(bias) } else { v };
    let (mut symtab, mut strtab, mut strsz, mut gnu_hash, mut sysv_hash, mut versym) = (0, 0, 0, 0, 0, 0);
    let mut d = bias.wrapping_add(dynamic.p_vaddr) as *const Elf64Dyn;
    // SAFETY: the dynamic section is mapped and ends with DT_NULL.
    unsafe {
        while (*d).d_tag != 0 {
            let v = (*d).d_un;
            match (*d).d_tag as u64 {
                6 => symtab = addr(v),
                5 => strtab = addr(v),
                10 => strsz = v,
                4 => sysv_hash = addr(v),
                DT_GNU_HASH => gnu_hash = addr(v),
                DT_VERSYM => versym = addr(v),
                _ => {}
            }
            d = d.add(1);
        }
    }
    if symtab == 0 || strtab == 0 {
        return Lookup::Absent;
    }
    let table = SymTable { bias, symtab, strtab, strsz, versym };
    let mut pick = Pick::default();
    // SAFETY: the hash tables index the symbol table they come with.
    unsafe {
        if gnu_hash != 0 {
            gnu_candidates(gnu_hash as *const u32, name, |i| table.offer(i, name, &mut pick));
        } else if sysv_hash != 0 {
            sysv_candidates(sysv_hash as *const u32, name, |i| table.offer(i, name, &mut pick));
        } else {
            return Lookup::Unreadable;
        }
    }
    pick.result()
}

struct SymTable {
    bias: u64,
    symtab: u64,
    strtab: u64,
    strsz: u64,
    versym: u64,
}

/// The candidates seen so far for one name in one object.
#[derive(Default)]
struct Pick {
    unversioned: Option<Lookup>,
    versioned: Option<Lookup>,
    versions: u32,
}

impl Pick {
    /// glibc's choice: an unversioned (or base-version) definition; else a versioned one if it
    /// is the only visible one.
    fn result(self) -> Lookup {
        match (self.unversioned, self.versioned) {
            (Some(l), _) => l,
            (None, Some(l)) if self.versions == 1 => l,
            (None, Some(_)) => Lookup::Unreadable,
            (None, None) => Lookup::Absent,
        }
    }
}

impl SymTable {
    /// Symbol `i`, found under `name`'s hash: recorded in `pick` if it is a definition of `name`.
    /// Returns false to stop the search (a definition without version was found).
    ///
    /// # Safety
    /// `i` indexes the symbol table (it came from its hash table).
    unsafe fn offer(&self, i: u32, name: &[u8], pick: &mut Pick) -> bool {
        // SAFETY: per the contract; the string table holds NUL-terminated names.
        let sym = unsafe { &*((self.symtab as *const libc::Elf64_Sym).add(i as usize)) };
        if sym.st_shndx == 0 || (self.strsz != 0 && sym.st_name as u64 >= self.strsz) {
            return true; // undefined here (a reference), or a broken entry
        }
        let sym_name = unsafe { CStr::from_ptr(self.strtab.wrapping_add(sym.st_name as u64) as *const c_char) };
        if sym_name.to_bytes() != name {
            return true;
        }
        let bind = sym.st_info >> 4;
        let kind = sym.st_info & 0xf;
        let visibility = sym.st_other & 3;
        if !matches!(bind, 1 | 2 | 10) || matches!(visibility, 1 | 2) {
            return true; // local, hidden or internal: not visible to dlsym
        }
        let found = match kind {
            // NOTYPE, OBJECT, FUNC, COMMON
            0 | 1 | 2 | 5 if sym.st_shndx != 0xfff1 && sym.st_value != 0 => {
                Lookup::Found(self.bias.wrapping_add(sym.st_value) as *mut c_void)
            }
            _ => Lookup::Unreadable, // TLS, IFUNC, absolute: glibc's to resolve
        };
        let version = if self.versym == 0 {
            0
        } else {
            // SAFETY: the version table has one entry per symbol.
            unsafe { *((self.versym as *const u16).add(i as usize)) }
        };
        if version & 0x7fff < 2 {
            pick.unversioned = Some(found);
            return false;
        }
        if version & 0x8000 == 0 {
            pick.versions += 1;
            if pick.versioned.is_none() {
                pick.versioned = Some(found);
            }
        }
        true
    }
}

fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

fn sysv_hash(name: &[u8]) -> u32 {
    let mut h = 0u32;
    for &c in name {
        h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        if g != 0 {
            h ^= g >> 24;
        }
        h &= !g;
    }
    h
}

/// Calls `offer` with each symbol index of a GNU hash table's chain for `name`, until it
/// returns false.
///
/// # Safety
/// `table` is a mapped DT_GNU_HASH table (64-bit bloom words).
unsafe fn gnu_candidates(table: *const u32, name: &[u8], mut offer: impl FnMut(u32) -> bool) {
    // SAFETY: the layout of DT_GNU_HASH: header, bloom words, buckets, chains.
    unsafe {
        let (nbuckets, symoffset, bloom_size, bloom_shift) = (*table, *table.add(1), *table.add(2), *table.add(3));
        if nbuckets == 0 || bloom_size == 0 {
            return;
        }
        let h = gnu_hash(name);
        let bloom = table.add(4) as *const u64;
        let word = *bloom.add(((h / 64) % bloom_size) as usize);
        let mask = (1u64 << (h % 64)) | (1u64 << ((h >> (bloom_shift % 32)) % 64));
        if word & mask != mask {
            return;
        }
        let buckets = bloom.add(bloom_size as usize) as *const u32;
        let chains = buckets.add(nbuckets as usize);
        let mut i = *buckets.add((h % nbuckets) as usize);
        if i < symoffset {
            return;
        }
        loop {
            let ch = *chains.add((i - symoffset) as usize);
            if (ch | 1) == (h | 1) && !offer(i) {
                return;
            }
            if ch & 1 != 0 {
                return;
            }
            i = i.wrapping_add(1);
        }
    }
}

/// The same for a SysV DT_HASH table.
///
/// # Safety
/// `table` is a mapped DT_HASH table.
unsafe fn sysv_candidates(table: *const u32, name: &[u8], mut offer: impl FnMut(u32) -> bool) {
    // SAFETY: the layout of DT_HASH: nbucket, nchain, buckets, chains.
    unsafe {
        let (nbucket, nchain) = (*table, *table.add(1));
        if nbucket == 0 {
            return;
        }
        let buckets = table.add(2);
        let chains = buckets.add(nbucket as usize);
        let mut i = *buckets.add((sysv_hash(name) % nbucket) as usize);
        let mut steps = 0;
        while i != 0 && i < nchain && steps < nchain {
            if !offer(i) {
                return;
            }
            i = *chains.add(i as usize);
            steps += 1;
        }
    }
}

type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
#[link_section = "gpumemtrace_hot"]
static CTX_GET_DEVICE: LazyFn = LazyFn::new();
static CTX_GET_DEVICE_TRIES: AtomicU32 = AtomicU32::new(0);

/// The calling thread's current device according to the driver, or -1.
pub fn current_device() -> i32 {
    // The driver is loaded before any allocation succeeds; give up after a few misses so a
    // process without libcuda does not scan its objects on every call.
    let find = || {
        if CTX_GET_DEVICE_TRIES.fetch_add(1, Ordering::Relaxed) >= 8 {
            return null_mut();
        }
        next_definition(c"cuCtxGetDevice")
    };
    // SAFETY: the driver's cuCtxGetDevice(CUdevice*), CUdevice being int.
    let Some(get) = (unsafe { CTX_GET_DEVICE.typed::<CtxGetDeviceFn>(find) }) else {
        return -1;
    };
    let mut dev: c_int = -1;
    // SAFETY: a valid out-pointer for the driver to fill.
    if unsafe { get(&mut dev) } == 0 {
        dev
    } else {
        -1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_the_elf_ones() {
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
    }

    /// The symbol-table reading agrees with glibc's dlsym, default versions included
    /// (`pthread_cond_wait` and `realpath` have two versions in libc).
    #[test]
    fn next_after_agrees_with_glibc() {
        let here = next_after_agrees_with_glibc as fn() as *const c_void;
        for name in [c"malloc", c"printf", c"pthread_cond_wait", c"realpath", c"dl_iterate_phdr", c"environ"] {
            let ours = next_after(here, name);
            let glibc = dlsym_real(libc::RTLD_DEFAULT, name);
            assert!(!glibc.is_null(), "{name:?}");
            assert_eq!(ours, Some(glibc), "{name:?}");
        }
        assert_eq!(next_after(here, c"gpumemtrace_no_such_symbol"), None);
        assert_eq!(next_after(std::ptr::null(), c"malloc"), None, "an unknown caller: glibc answers");
    }

    #[test]
    fn our_range_holds_our_code_and_nothing_of_libc() {
        assert!(is_ours(is_ours as *const c_void));
        assert!(!is_ours(libc::malloc as *const c_void));
        assert!(!is_ours(std::ptr::null()));
    }
}
