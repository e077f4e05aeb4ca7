//! The journal's marks and rings, tested through the reader the writer and recovery use.

use super::*;
use gpumemtrace_format::recover::Journal as ReadJournal;
use gpumemtrace_format::raw::{Msg, RawPhase};
use gpumemtrace_format::PhaseOp;

/// A mark is odd while its thread stamps; a call nested inside (a signal handler's) leaves it
/// alone; leaving moves it on by two, and the writer sees the ring idle again.
#[test]
fn a_mark_is_odd_while_stamping_and_nested_calls_leave_it_alone() {
    let jn: &'static Journal = Box::leak(Box::new(Journal::create(&std::env::temp_dir().join("gmt-mark-test.trace"), 0o600, false).unwrap()));
    let marks = jn.marks(4);
    assert_eq!(jn.stamping(4), Seen::Idle);
    let outer = Journal::enter(marks);
    let Mark::Own(_, g) = outer else { panic!("the ring's own mark") };
    assert_eq!(jn.stamping(4), Seen::Busy(g + 1));
    let nested = Journal::enter(marks);
    assert!(matches!(nested, Mark::Nested));
    Journal::note_key(nested, 5);
    Journal::leave(nested);
    assert_eq!(jn.stamping(4), Seen::Busy(g + 1), "the nested call changed nothing");
    assert_eq!(jn.stamped_key(4, g + 1), None, "no key noted yet");
    Journal::note_key(outer, 77);
    assert_eq!(jn.stamped_key(4, g + 1), Some(77));
    Journal::leave(outer);
    assert_eq!(jn.stamping(4), Seen::Idle);
    assert!(jn.moved_on(4, g + 1));
}

/// A signal handler's call that runs whole between `enter`'s read and its increment: the
/// outer call takes the generation after it, marked, and leaves the ring idle.
#[test]
fn a_call_nested_between_the_read_and_the_increment_leaves_the_outer_one_marked() {
    let jn: &'static Journal = Box::leak(Box::new(Journal::create(&std::env::temp_dir().join("gmt-mark-test2.trace"), 0o600, false).unwrap()));
    let marks = jn.marks(6);
    fn nested() {
        let jn = NESTED_JOURNAL.with(|j| j.get().unwrap());
        let inner = Journal::enter(jn.marks(6));
        assert!(matches!(inner, Mark::Own(..)), "the outer call had not marked yet");
        Journal::note_key(inner, 3);
        Journal::leave(inner);
    }
    NESTED_JOURNAL.with(|j| j.set(Some(jn)));
    BETWEEN.with(|f| f.set(Some(nested)));
    let outer = Journal::enter(marks);
    let Mark::Own(_, g) = outer else { panic!("the ring's own mark") };
    assert_eq!(g, 2, "generation 0, two for the nested call's enter and leave");
    assert_eq!(jn.stamping(6), Seen::Busy(3));
    Journal::note_key(outer, 9);
    assert_eq!(jn.stamped_key(6, 3), Some(9));
    Journal::leave(outer);
    assert_eq!(jn.stamping(6), Seen::Idle);
}

/// A nested call that enters in that window and never leaves (a handler that jumps out):
/// the outer call still ends up marked, and idle again once it leaves.
#[test]
fn a_call_nested_there_that_never_leaves_does_not_unmark_the_outer_one() {
    let jn: &'static Journal = Box::leak(Box::new(Journal::create(&std::env::temp_dir().join("gmt-mark-test3.trace"), 0o600, false).unwrap()));
    let marks = jn.marks(7);
    fn nested_gone() {
        let jn = NESTED_JOURNAL.with(|j| j.get().unwrap());
        let _abandoned = Journal::enter(jn.marks(7));
    }
    NESTED_JOURNAL.with(|j| j.set(Some(jn)));
    BETWEEN.with(|f| f.set(Some(nested_gone)));
    let outer = Journal::enter(marks);
    assert!(matches!(outer, Mark::Own(..)));
    assert!(matches!(jn.stamping(7), Seen::Busy(_)), "marked while stamping");
    Journal::leave(outer);
    assert_eq!(jn.stamping(7), Seen::Idle);
}

thread_local! {
    /// Run by `Journal::enter` between its read of the mark and its increment (tests only):
    /// where a signal handler's nested call could fall.
    pub(super) static BETWEEN: std::cell::Cell<Option<fn()>> = const { std::cell::Cell::new(None) };
    static NESTED_JOURNAL: std::cell::Cell<Option<&'static Journal>> = const { std::cell::Cell::new(None) };
}

#[test]
fn entries_pushed_come_out_in_order_across_the_ring_end_and_space_returns_on_commit() {
    let dir = std::env::temp_dir().join(format!("gmt-ring-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.trace");
    let jn = Journal::create(&trace, 0o600, true).unwrap();
    assert!(j::path_for(&trace).exists());
    let me = jn.claim(7);
    assert_eq!(me, 0);
    assert_eq!(jn.claim(8), 1);
    jn.release(1);
    assert_eq!(jn.claim(9), 1);
    let phase = |n: u64| {
        let mut p = Vec::new();
        let name = "x".repeat(980);
        j::encode(&Msg::Phase(RawPhase { seq: n, time_ns: n, tid: 7, op: PhaseOp::Mark, name }), &mut p);
        p
    };
    let seq_of = |e: &[u8]| match j::decode(e).unwrap() {
        j::Entry::Msg(Msg::Phase(p)) => p.seq as usize,
        _ => unreachable!(),
    };
    let (mut pos, mut got, mut waits) = (0u64, 0usize, 0);
    for n in 0..5000u64 {
        let p = phase(n);
        let r = jn.push(me, &p, |_| {
            // Full: play the writer, take everything and commit it.
            waits += 1;
            pos = jn.take(me, pos, |_, e| {
                assert_eq!(seq_of(e), got);
                got += 1;
            });
            let mut all = [0u64; RINGS];
            all[me] = pos;
            jn.commit(&all);
            true
        });
        assert!(r.is_some());
    }
    let uncommitted = 5000 - got;
    jn.take(me, pos, |_, _| got += 1);
    assert_eq!(got, 5000);
    assert!(waits > 0, "1000-byte entries must wrap a 1 MiB ring");
    // What a reader finds in the file: the uncommitted entries.
    let read = ReadJournal::read(&j::path_for(&trace)).unwrap();
    assert_eq!((read.pending(), read.damaged), (uncommitted, false));
    jn.remove_file();
    assert!(!j::path_for(&trace).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn events_written_in_place_read_back_whole_also_where_they_wrap_around_the_ring_end() {
    use gpumemtrace_format::raw::{RawEvent, Stack};
    let jn = Journal::create(Path::new("/nonexistent/t.trace"), 0o600, true).unwrap();
    let me = jn.claim(7);
    // Sizes from a bare free (35 bytes) up to a thread's first event with its name, so
    // that payloads end, and begin, at every offset around the ring's end.
    let event = |n: u64| RawEvent {
        seq: n,
        api: 3,
        time_ns: 1000 + n,
        tid: 7,
        result: 0,
        device: (n % 3) as i32,
        addr: 0x7f00_0000 + n * 512,
        size: n % 5 * 512,
        stream: 0,
        extra: 0,
        total_allocated: n % 7 * 4096,
        total_reserved: n % 2 * (2 << 20),
        flags: (n % 2) as u32,
        frames: Stack { key: n % 11, frames: vec![] },
        py: None,
        py_key: n % 13,
        py_tstate: n.is_multiple_of(2),
        thread_name: n.is_multiple_of(17).then(|| "t".repeat((n % 90) as usize)),
    };
    let (mut pos, mut got, mut wrapped) = (0u64, 0u64, 0);
    for n in 0..40_000u64 {
        let e = event(n);
        let plan = j::plan_event(&e);
        assert!(plan.bytes() <= IN_PLACE_MAX);
        let head = jn.u64(Journal::control(me, ring::HEAD)).load(Relaxed);
        let at = (head + j::FRAME) % j::RING_BYTES;
        wrapped += (at + plan.bytes() as u64 > j::RING_BYTES) as usize;
        let r = jn.push_in_place(me, plan.bytes(), |_| {
            pos = jn.take(me, pos, |_, bytes| {
                assert_eq!(j::decode(bytes).unwrap(), j::Entry::Msg(Msg::Event(event(got))));
                got += 1;
            });
            let mut all = [0u64; RINGS];
            all[me] = pos;
            jn.commit(&all);
            true
        }, |dst| {
            j::write_event(&e, &plan, dst);
            plan.bytes()
        });
        assert!(r.is_some());
    }
    jn.take(me, pos, |_, bytes| {
        assert_eq!(j::decode(bytes).unwrap(), j::Entry::Msg(Msg::Event(event(got))));
        got += 1;
    });
    assert_eq!(got, 40_000);
    assert!(wrapped > 0, "some payloads wrap around the ring's end");
}

#[test]
fn a_producer_that_gives_up_writes_nothing() {
    let jn = Journal::create(Path::new("/nonexistent/t.trace"), 0o600, true).unwrap();
    assert!(jn.path.is_none(), "no directory: anonymous memory");
    let big = vec![1u8; j::MAX_ENTRY - 8];
    let mut n = 0;
    while jn.push(0, &big, |_| false).is_some() {
        n += 1;
    }
    assert_eq!(n, 4);
    let mut seen = 0;
    jn.take(0, 0, |_, _| seen += 1);
    assert_eq!(seen, 4);
}
