use super::*;

/// The one-pass warm encoding is byte for byte the planned one, for every combination of
/// present scalars; events with frames, Python frames or a name are not warm.
#[test]
fn a_warm_event_is_written_as_the_plan_writes_it() {
    let event = |bits: u32| {
        let on = |b: u32, v: u64| if bits & (1 << b) != 0 { v } else { 0 };
        RawEvent {
            seq: 77,
            api: 3,
            time_ns: 123_456,
            tid: 9,
            result: on(0, 2) as u32,
            device: on(1, 5) as i32,
            addr: 0x7f00_0000_1000,
            size: on(2, 4096),
            stream: on(3, 0x55),
            extra: on(4, 7),
            total_allocated: on(5, 1 << 30),
            total_reserved: on(6, 2 << 30),
            flags: on(7, 1) as u32,
            frames: crate::raw::Stack { key: on(8, 0xabc), frames: vec![] },
            py: None,
            py_key: on(9, 0xdef),
            py_tstate: bits & (1 << 10) != 0,
            thread_name: None,
        }
    };
    for bits in 0u32..(1 << 11) {
        let e = event(bits);
        let plan = plan_event(&e);
        let mut planned = vec![0u8; plan.bytes()];
        write_event(&e, &plan, &mut planned);
        let mut warm = [0xEEu8; WARM_MAX];
        let n = write_warm_event(&e, &mut warm).expect("warm");
        assert_eq!(&warm[..n], &planned[..], "bits {bits:#b}");
        // The writer's quick read gives the event back; an entry cut short or run long is left
        // to the general decoder, which names the fault.
        assert_eq!(decode_warm(&warm[..n]).as_ref(), Some(&e), "bits {bits:#b}");
        assert_eq!(decode_warm_event(&warm[..n]).as_ref(), Some(&e), "bits {bits:#b}");
        assert!(matches!(decode(&warm[..n]), Ok(Entry::Msg(Msg::Event(d))) if d == e));
        assert_eq!(decode_warm(&warm[..n - 1]), None);
        assert!(decode(&warm[..n - 1]).is_err());
        let mut long = warm[..n].to_vec();
        long.push(0);
        assert_eq!(decode_warm(&long), None);
        assert!(decode(&long).is_err());
    }
    // Only an event entry is read as one: a phase whose bytes would pass for a warm event (no
    // optional fields where the mask would be, an event's length) is not.
    let mut phase = Vec::new();
    encode(&Msg::Phase(RawPhase { seq: 2, time_ns: 0, tid: 77, op: PhaseOp::Push, name: "p".into() }), &mut phase);
    phase.resize(EVENT_FIXED, 0);
    assert!(decode_warm(&phase).is_some(), "the layout alone would take it");
    assert_eq!(decode_warm_event(&phase), None);
    let mut buf = [0u8; WARM_MAX];
    let named = RawEvent { thread_name: Some("t".into()), ..event(0) };
    assert_eq!(write_warm_event(&named, &mut buf), None);
    let framed = RawEvent { frames: crate::raw::Stack { key: 1, frames: vec![1] }, ..event(0) };
    assert_eq!(write_warm_event(&framed, &mut buf), None);
}

fn event(seq: u64, frames: Vec<u64>, py: Option<PyCapture>, name: Option<&str>) -> Msg {
    Msg::Event(RawEvent {
        seq,
        api: 3,
        time_ns: 1_000 + seq,
        tid: 77,
        result: 0,
        device: -1,
        addr: 0xdead_0000 + seq,
        size: 4096,
        stream: 5,
        extra: 6,
        total_allocated: 7,
        total_reserved: 8,
        flags: 1,
        frames: Stack { key: if frames.is_empty() { 0 } else { 42 }, frames },
        py_key: if py.is_some() { 9 } else { 0 },
        py: py.map(Box::new),
        py_tstate: true,
        thread_name: name.map(str::to_owned),
    })
}

fn code(n: u64, linetable: usize) -> CodeInfo {
    CodeInfo {
        code: n,
        sig: n * 3,
        name: format!("f{n}"),
        qualname: format!("C.f{n}"),
        filename: "train.py".into(),
        firstlineno: 10,
        linetable_format: line_table_format::PY311,
        linetable: vec![7; linetable],
    }
}

fn entries(m: &Msg) -> Vec<Entry> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    encode_each(m, &mut buf, |p| {
        assert!(p.len() <= MAX_PAYLOAD, "{}", p.len());
        out.push(decode(p).unwrap())
    });
    out
}

#[test]
fn every_message_comes_back_as_it_was_encoded_its_code_objects_first() {
    let py = PyCapture {
        frames: vec![RawPyFrame { code: 1, sig: 3, instr: 12, flags: 1 }],
        new_codes: vec![code(1, 30)],
    };
    let with_codes = event(0, vec![1, 2, 3], Some(py), Some("main"));
    let Msg::Event(mut without) = event(0, vec![1, 2, 3], None, Some("main")) else { unreachable!() };
    without.py = Some(Box::new(PyCapture { frames: vec![RawPyFrame { code: 1, sig: 3, instr: 12, flags: 1 }], new_codes: vec![] }));
    without.py_key = 9;
    assert_eq!(entries(&with_codes), vec![Entry::Codes(vec![code(1, 30)]), Entry::Msg(Msg::Event(without))]);
    for m in [
        event(1, vec![], None, None),
        Msg::Phase(RawPhase { seq: 2, time_ns: 5, tid: 77, op: PhaseOp::Push, name: "epoch 1".into() }),
    ] {
        let mut buf = Vec::new();
        encode(&m, &mut buf);
        assert_eq!(decode(&buf).unwrap(), Entry::Msg(m));
    }
}

#[test]
fn no_entry_outgrows_a_ring_and_nothing_needed_is_cut() {
    let py = PyCapture {
        frames: (0..2000).map(|i| RawPyFrame { code: i, sig: i * 3, instr: 0, flags: 0 }).collect(),
        new_codes: (0..2000).map(|i| code(i, 2000)).collect(),
    };
    let got = entries(&event(0, vec![1; 1024], Some(py), Some(&"x".repeat(1 << 20))));
    let codes: Vec<&CodeInfo> = got.iter().filter_map(|e| if let Entry::Codes(c) = e { Some(c) } else { None }).flatten().collect();
    assert_eq!(codes.len(), 2000);
    assert!(codes.iter().all(|c| c.linetable.len() == 2000), "line tables that fit an entry are kept");
    let Some(Entry::Msg(Msg::Event(e))) = got.last() else { panic!() };
    assert_eq!(e.py.as_ref().unwrap().frames.len(), 2000, "the stack itself is kept whole");
    assert_eq!(e.frames.frames.len(), 1024);
    assert!(e.thread_name.as_ref().unwrap().len() <= CUT_STRING);
    // One code object larger than an entry: its line table goes, its name stays.
    let huge = PyCapture { frames: vec![], new_codes: vec![code(5, 200_000)] };
    let got = entries(&event(0, vec![], Some(huge), None));
    let Entry::Codes(c) = &got[0] else { panic!() };
    assert_eq!((c[0].name.as_str(), c[0].linetable.len()), ("f5", 0));
}

#[test]
fn garbage_never_panics() {
    let mut buf = Vec::new();
    encode(&event(0, vec![1, 2, 3], None, Some("t")), &mut buf);
    for cut in 0..buf.len() {
        assert!(decode(&buf[..cut]).is_err());
    }
    let mut bad = buf.clone();
    // The frame count's top byte: after the fixed part, device, five u64s, flags, stack key.
    bad[EVENT_FIXED + 4 + 40 + 4 + 8 + 3] = 0xff;
    assert!(decode(&bad).is_err());
    let mut bad = buf.clone();
    bad[10] |= 0x80; // a field this reader does not know
    assert!(decode(&bad).is_err());
    let mut long = buf.clone();
    long.push(0);
    assert!(decode(&long).is_err(), "bytes past the fields are not ignored");
}

#[test]
fn an_event_carries_only_its_fields_that_are_not_zero() {
    let bare = RawEvent {
        seq: 9,
        api: 2,
        time_ns: 123,
        tid: 5,
        result: 0,
        device: 0,
        addr: 0x7f00_0000,
        size: 0,
        stream: 0,
        extra: 0,
        total_allocated: 0,
        total_reserved: 0,
        flags: 0,
        frames: Stack { key: 0, frames: vec![] },
        py: None,
        py_key: 0,
        py_tstate: false,
        thread_name: None,
    };
    let mut buf = Vec::new();
    encode(&Msg::Event(bare.clone()), &mut buf);
    assert_eq!(buf.len(), EVENT_FIXED, "a driver free: the fixed part alone");
    assert_eq!(decode(&buf).unwrap(), Entry::Msg(Msg::Event(bare.clone())));
    // A warm block allocation: size, device, totals, flags, both keys.
    let block = RawEvent {
        size: 512,
        device: 1,
        total_allocated: 4096,
        total_reserved: 1 << 21,
        flags: 1,
        frames: Stack { key: 77, frames: vec![] },
        py_key: 88,
        py_tstate: true,
        ..bare.clone()
    };
    encode(&Msg::Event(block.clone()), &mut buf);
    assert_eq!(buf.len(), EVENT_FIXED + 4 + 8 * 3 + 4 + 16);
    assert!(entry_bytes(buf.len()) <= 128, "two cache lines at most");
    assert_eq!(decode(&buf).unwrap(), Entry::Msg(Msg::Event(block)));
    // Each field alone comes back, and only it.
    let one: Vec<RawEvent> = vec![
        RawEvent { result: 2, ..bare.clone() },
        RawEvent { device: -1, ..bare.clone() },
        RawEvent { stream: 3, ..bare.clone() },
        RawEvent { extra: 4, ..bare.clone() },
        RawEvent { frames: Stack { key: 0, frames: vec![1, 2] }, ..bare.clone() },
        RawEvent { py: Some(Box::new(PyCapture { frames: vec![], new_codes: vec![] })), ..bare.clone() },
        RawEvent { thread_name: Some(String::new()), ..bare.clone() },
    ];
    for e in one {
        encode(&Msg::Event(e.clone()), &mut buf);
        assert_eq!(decode(&buf).unwrap(), Entry::Msg(Msg::Event(e)));
    }
}
