use super::*;
use super::code::{signature, SigOffsets};

#[test]
#[cfg(target_arch = "x86_64")]
fn the_initialized_flag_is_read_where_py_isinitialized_reads_it() {
    // `mov eax, [rip + disp]; ret`, with and without `endbr64`: the flag (an aligned int) is
    // at the end of the `mov` plus the displacement.
    let code = |prefix: &[u8], end: u64| -> (Vec<u8>, u64) {
        let mut v = vec![0u8; 16];
        let at = v.as_ptr() as u64 + prefix.len() as u64 + 6;
        let disp = 0x1000 + (4 - at % 4) % 4;
        let bytes: Vec<u8> = prefix.iter().copied().chain([0x8B, 0x05]).chain((disp as i32).to_le_bytes()).chain([end as u8]).collect();
        v[..bytes.len()].copy_from_slice(&bytes);
        (v, at + disp)
    };
    for prefix in [&[][..], &[0xF3, 0x0F, 0x1E, 0xFA][..]] {
        let (v, flag) = code(prefix, 0xC3);
        assert_eq!(flag_read_by(v.as_ptr()), Some(flag), "{v:x?}");
        let (v, _) = code(prefix, 0x90);
        assert_eq!(flag_read_by(v.as_ptr()), None, "more code after the load: {v:x?}");
    }
    // Through the GOT: `mov rax, [rip + d]; mov eax, [rax + 16]; ret`, the slot 32 bytes
    // after the code (at 32 of an 8-aligned buffer) holding `_PyRuntime`'s address.
    let runtime = [0u64; 4];
    let mut v = vec![0u64; 8];
    v[4] = runtime.as_ptr() as u64;
    let code: Vec<u8> = [0x48, 0x8B, 0x05].into_iter().chain((32 - 7i32).to_le_bytes()).chain([0x8B, 0x40, 0x10, 0xC3]).collect();
    // SAFETY: 11 bytes into the first 16 of the 64-byte buffer.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), v.as_mut_ptr().cast::<u8>(), code.len()) };
    assert_eq!(flag_read_by(v.as_ptr().cast()), Some(runtime.as_ptr() as u64 + 16));
    // Anything else is called instead: another register, more code, another prefix.
    for other in [
        [0x8B, 0x0D, 0x00, 0x10, 0x00, 0x00, 0xC3, 0, 0, 0, 0],
        [0xF3, 0x0F, 0x1E, 0xFB, 0x8B, 0x05, 0x00, 0x10, 0x00, 0x00, 0xC3],
        [0x55, 0x48, 0x89, 0xE5, 0, 0, 0, 0, 0, 0, 0],
    ] {
        assert_eq!(flag_read_by(other.as_ptr()), None, "{other:x?}");
    }
}

/// A lower key holding the same state on the finding thread (pybind11's, say) is taken, and
/// dropped at the first lookup where it disagrees with the interpreter's own function.
#[test]
fn the_thread_state_key_is_dropped_when_it_disagrees_with_the_interpreter() {
    static INTERPRETERS: AtomicU32 = AtomicU32::new(0);
    extern "C" fn get_tstate() -> *mut c_void {
        // SAFETY: a key this test created.
        unsafe { libc::pthread_getspecific(INTERPRETERS.load(Relaxed)) }
    }
    extern "C" fn is_initialized() -> i32 {
        1
    }
    let (mut other, mut interpreters) = (0, 0);
    // SAFETY: plain key creation; the keys stay for the process.
    unsafe {
        assert_eq!(libc::pthread_key_create(&mut other, None), 0);
        assert_eq!(libc::pthread_key_create(&mut interpreters, None), 0);
    }
    let (low, high) = (other.min(interpreters), other.max(interpreters));
    INTERPRETERS.store(high, Relaxed);
    let interp = Interp {
        layout: Layout::for_minor(12).unwrap(),
        get_tstate,
        is_initialized,
        initialized_flag: None,
        code_type: 0,
        unicode_type: 0,
        bytes_type: 0,
    };
    let state = 0x7f00_0000_1230u64;
    // SAFETY: setting keys this test created.
    unsafe {
        libc::pthread_setspecific(low, state as *const c_void);
        libc::pthread_setspecific(high, state as *const c_void);
    }
    find_key(state);
    assert_eq!(TSS_KEY.load(Relaxed), low, "the lowest key holding the state");
    assert_eq!(this_thread_state(&interp), state);
    assert_eq!(TSS_KEY.load(Relaxed), low);
    // Another thread where only the interpreter's key holds its state: its first lookup is
    // checked, finds the disagreement and gives the interpreter's answer.
    let other_state = 0x7f00_0000_4560u64;
    let seen = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: as above.
            unsafe { libc::pthread_setspecific(high, other_state as *const c_void) };
            this_thread_state(&interp)
        })
        .join()
        .unwrap()
    });
    assert_eq!(seen, other_state);
    assert_eq!(TSS_KEY.load(Relaxed), KEY_NONE, "the key is not used again");
    assert_eq!(this_thread_state(&interp), state);
}

#[test]
fn cache_remembers_by_address_and_signature() {
    let code = 0x7f00_1234_5670;
    assert!(!cache_has(code, 77));
    remember(&[(code, 77)]);
    assert!(cache_has(code, 77));
    assert!(!cache_has(code, 79), "a reused address with another signature is new");
}

/// 3.12+: a code object's number (`co_version`) is its signature, its strings unread; a code
/// object numbered 0 (the interpreter's counter ran out) is told by its strings, as before 3.12.
#[test]
fn the_code_objects_number_is_its_signature_from_3_12() {
    let l = Layout::for_minor(12).unwrap();
    let with = SigOffsets::of(&l);
    let without = SigOffsets { version: None, ..SigOffsets::of(&l) };
    // A `str` header: its cached hash at 24.
    let strs = |name_hash: i64| -> Vec<i64> { vec![1, 0, 3, name_hash, 0, 0, 0, 0] };
    let (name_a, name_b, file) = (strs(111), strs(222), strs(333));
    // A code object (u64 words) with its name, file name and number where the layout says.
    let code = |name: &Vec<i64>, version: u32| -> Vec<u64> {
        let mut v = vec![0u64; 32];
        v[l.code_name / 8] = name.as_ptr() as u64;
        v[l.code_filename / 8] = file.as_ptr() as u64;
        v[l.code_linetable / 8] = 0x7f00_0000_0000;
        let at = l.code_version.unwrap();
        // SAFETY: a u32 inside the buffer.
        unsafe { (v.as_mut_ptr().cast::<u8>().add(at) as *mut u32).write_unaligned(version) };
        v
    };
    // SAFETY (below): every "code object" is a buffer laid out as above, its pointers to live buffers.
    let sig = |at: &SigOffsets, c: &Vec<u64>| unsafe { signature(at, c.as_ptr() as u64) };
    let (a7, b7, a8) = (code(&name_a, 7), code(&name_b, 7), code(&name_a, 8));
    assert_eq!(sig(&with, &a7), sig(&with, &b7), "numbered: the strings are not read");
    assert_ne!(sig(&with, &a7), sig(&with, &a8), "another number: another code object");
    assert_ne!(sig(&without, &a7), sig(&without, &b7), "unnumbered layouts read the strings");
    let (a0, b0) = (code(&name_a, 0), code(&name_b, 0));
    assert_eq!(sig(&with, &a0), sig(&without, &a0), "number 0: the strings decide");
    assert_ne!(sig(&with, &a0), sig(&with, &b0));
    for s in [sig(&with, &a7), sig(&with, &a0)] {
        assert_eq!(s & 1, 1, "never 0");
    }
}

/// A stack's key taken up from the outer frames it shares with the thread's last stack is the
/// key of the whole stack.
#[test]
fn a_key_going_on_from_shared_outer_frames_is_the_whole_stacks_key() {
    let f = |code: u64, instr: u32| RawPyFrame { code, sig: code | 1, instr, flags: 0 };
    // Innermost first; each stack shares some outer frames with the one before.
    let stacks: Vec<Vec<RawPyFrame>> = vec![
        vec![f(0x30, 4), f(0x20, 8), f(0x10, 2)],
        vec![f(0x40, 2), f(0x30, 4), f(0x20, 8), f(0x10, 2)],
        vec![f(0x20, 10), f(0x10, 2)],
        vec![],
        vec![f(0x50, 6), f(0x20, 10), f(0x10, 2)],
        vec![f(0x50, 6), f(0x20, 10), f(0x10, 2)],
        vec![f(0x60, 0)],
    ];
    let mut partials = Vec::new();
    let mut prev: &[RawPyFrame] = &[];
    let mut keys = std::collections::HashSet::new();
    for s in &stacks {
        let shared = prev.iter().rev().zip(s.iter().rev()).take_while(|(a, b)| a == b).count();
        let key = key_going_on(s, shared, &mut partials);
        assert_eq!(key, stack_key(s), "{s:x?} after {prev:x?}");
        assert_eq!(partials.len(), s.len() + 1);
        keys.insert(key);
        prev = s;
    }
    assert_eq!(keys.len(), 6, "one key a distinct stack, 0 for none");
    assert_eq!(stack_key(&[]), 0);
    // More shared frames claimed than the last stack had are taken as what it had.
    let mut partials = Vec::new();
    assert_eq!(key_going_on(&stacks[0], 3, &mut partials), stack_key(&stacks[0]));
}
