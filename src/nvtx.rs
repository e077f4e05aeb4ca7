//! NVTX ranges as phases, with no change to the program: NVTX's injection protocol.
//!
//! A program that uses NVTX (v2's `libnvToolsExt` or the header-only v3) looks, at its first
//! NVTX call, for the library named by `NVTX_INJECTION64_PATH`, `dlopen`s it and calls its
//! `InitializeInjectionNvtx2(getExportTable)`. `gpumemtrace run` points that variable at this
//! library (already preloaded, so `dlopen` just hands it back). We ask the export table for the
//! callbacks table (`NVTX_ETID_CALLBACKS` = 1), ask that for the function tables of the CORE
//! module (1: `nvtxRangePushA/W/Ex`, `nvtxRangePop`, `nvtxMarkA/W/Ex`) and the CORE2 module
//! (5: the domain variants, `nvtxDomainRegisterStringA`), and write our functions into their
//! slots. Each table entry is the address of one function-pointer slot, indexed by callback id.
//!
//! Push/pop become phase pushes/pops on the calling thread and marks become process marks
//! (`crate::phases`). `nvtxRangeStart/End` ranges may end on another thread and overlap, which
//! the nested phase model cannot express: they are left to NVTX's no-ops.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Mutex;

use gpumemtrace_format::PhaseOp;

use crate::phases::record;

type Slot = *mut Option<unsafe extern "C" fn()>;
type GetModuleFunctionTable = unsafe extern "C" fn(module: c_int, table: *mut *mut Slot, size: *mut u32) -> c_int;
type GetExportTable = unsafe extern "C" fn(id: u32) -> *const c_void;

#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

const ETID_CALLBACKS: u32 = 1;
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;

// Callback ids of the CORE module.
const CORE_MARK_EX: usize = 1;
const CORE_MARK_A: usize = 2;
const CORE_MARK_W: usize = 3;
const CORE_RANGE_PUSH_EX: usize = 8;
const CORE_RANGE_PUSH_A: usize = 9;
const CORE_RANGE_PUSH_W: usize = 10;
const CORE_RANGE_POP: usize = 11;
// Callback ids of the CORE2 (domain) module.
const CORE2_MARK_EX: usize = 1;
const CORE2_RANGE_PUSH_EX: usize = 4;
const CORE2_RANGE_POP: usize = 5;
const CORE2_REGISTER_STRING_A: usize = 10;

/// `nvtxEventAttributes_t` (version 3), as far as the message.
#[repr(C)]
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;

unsafe fn ascii(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NVTX passes NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `wchar_t` is UTF-32 on Linux.
unsafe fn wide(mut p: *const u32) -> String {
    let mut s = String::new();
    if p.is_null() {
        return s;
    }
    // SAFETY: NUL-terminated wide string, read up to a bound.
    unsafe {
        while *p != 0 && s.len() < 4096 {
            s.push(char::from_u32(*p).unwrap_or('\u{fffd}'));
            p = p.add(1);
        }
    }
    s
}

unsafe fn message(a: *const EventAttributes) -> String {
    if a.is_null() {
        return String::new();
    }
    // SAFETY: the caller passes a valid attributes struct; `size` says how much of it exists.
    unsafe {
        let a = &*a;
        if (a.size as usize) < std::mem::size_of::<EventAttributes>() {
            return String::new();
        }
        match a.message_type {
            MESSAGE_ASCII | MESSAGE_REGISTERED => ascii(a.message as *const c_char),
            MESSAGE_UNICODE => wide(a.message as *const u32),
            _ => String::new(),
        }
    }
}

unsafe extern "C" fn push_a(m: *const c_char) -> c_int {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Push, &unsafe { ascii(m) });
    0
}
unsafe extern "C" fn push_w(m: *const u32) -> c_int {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Push, &unsafe { wide(m) });
    0
}
unsafe extern "C" fn push_ex(a: *const EventAttributes) -> c_int {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Push, &unsafe { message(a) });
    0
}
extern "C" fn pop() -> c_int {
    record(PhaseOp::Pop, "");
    0
}
unsafe extern "C" fn mark_a(m: *const c_char) {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Mark, &unsafe { ascii(m) });
}
unsafe extern "C" fn mark_w(m: *const u32) {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Mark, &unsafe { wide(m) });
}
unsafe extern "C" fn mark_ex(a: *const EventAttributes) {
    // SAFETY: NVTX's contract.
    record(PhaseOp::Mark, &unsafe { message(a) });
}
unsafe extern "C" fn domain_push_ex(_d: *mut c_void, a: *const EventAttributes) -> c_int {
    // SAFETY: NVTX's contract.
    unsafe { push_ex(a) }
}
extern "C" fn domain_pop(_d: *mut c_void) -> c_int {
    pop()
}
unsafe extern "C" fn domain_mark_ex(_d: *mut c_void, a: *const EventAttributes) {
    // SAFETY: NVTX's contract.
    unsafe { mark_ex(a) }
}
/// A registered string's handle is a pointer to a copy of it that lives for the process, so
/// `MESSAGE_REGISTERED` messages read like ASCII ones.
unsafe extern "C" fn register_string_a(_d: *mut c_void, s: *const c_char) -> *const c_char {
    static STRINGS: Mutex<Option<HashMap<String, &'static CStr>>> = Mutex::new(None);
    // SAFETY: NVTX's contract.
    let s = unsafe { ascii(s) };
    let mut m = STRINGS.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    let c = *m.entry(s.clone()).or_insert_with(|| {
        let c = CString::new(s.replace('\0', "")).unwrap_or_default();
        Box::leak(c.into_boxed_c_str())
    });
    c.as_ptr()
}

/// Writes `f` into slot `id` of `module`'s table; false when the table is missing or short.
unsafe fn install(get: GetModuleFunctionTable, module: c_int, slots: &[(usize, unsafe extern "C" fn())]) -> bool {
    let mut table: *mut Slot = std::ptr::null_mut();
    let mut size: u32 = 0;
    // SAFETY: NVTX's callback: fills a table pointer and its highest valid index.
    if unsafe { get(module, &mut table, &mut size) } == 0 || table.is_null() {
        return false;
    }
    for &(id, f) in slots {
        if id > size as usize {
            continue;
        }
        // SAFETY: `id` is within the table; each entry is null or points at a slot.
        unsafe {
            let slot = *table.add(id);
            if !slot.is_null() {
                *slot = Some(f);
            }
        }
    }
    true
}

/// NVTX's entry point into an injection library. Returns 1 (attached) or 0.
///
/// # Safety
/// Called by NVTX with its export-table getter.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get_export_table: Option<GetExportTable>) -> c_int {
    let Some(get) = get_export_table else { return 0 };
    if crate::config::disabled_for_nvtx() {
        return 0;
    }
    let r = std::panic::catch_unwind(|| {
        // SAFETY: NVTX hands out its callbacks export table, or null.
        let cb = unsafe { get(ETID_CALLBACKS) } as *const ExportTableCallbacks;
        if cb.is_null() {
            return 0;
        }
        // SAFETY: non-null export table; `struct_size` says which fields exist.
        let cb = unsafe { &*cb };
        if cb.struct_size < std::mem::size_of::<ExportTableCallbacks>() {
            return 0;
        }
        let Some(get_table) = cb.get_module_function_table else { return 0 };
        // SAFETY: each function has the signature of the NVTX function of its callback id
        // (the slots are typed `void(*)(void)` and cast back by NVTX).
        unsafe {
            let f = |p: *const ()| std::mem::transmute::<*const (), unsafe extern "C" fn()>(p);
            let core = install(
                get_table,
                MODULE_CORE,
                &[
                    (CORE_MARK_EX, f(mark_ex as *const ())),
                    (CORE_MARK_A, f(mark_a as *const ())),
                    (CORE_MARK_W, f(mark_w as *const ())),
                    (CORE_RANGE_PUSH_EX, f(push_ex as *const ())),
                    (CORE_RANGE_PUSH_A, f(push_a as *const ())),
                    (CORE_RANGE_PUSH_W, f(push_w as *const ())),
                    (CORE_RANGE_POP, f(pop as *const ())),
                ],
            );
            install(
                get_table,
                MODULE_CORE2,
                &[
                    (CORE2_MARK_EX, f(domain_mark_ex as *const ())),
                    (CORE2_RANGE_PUSH_EX, f(domain_push_ex as *const ())),
                    (CORE2_RANGE_POP, f(domain_pop as *const ())),
                    (CORE2_REGISTER_STRING_A, f(register_string_a as *const ())),
                ],
            );
            core as c_int
        }
    });
    r.unwrap_or(0)
}
