//! Every record fits the format's bounds ([`MAX_RECORD_LEN`], [`MAX_FRAMES`]): fields the
//! traced program controls (its argument list, paths, thread and phase names, Python names) are
//! cut before encoding, and marked where they are text. A 1.2 MB argument list once made the
//! Process record, and with it the whole trace, unreadable.
//!
//! - A string longer than [`MAX_FIELD_LEN`] keeps its first bytes (at a character boundary) and
//!   ends in `…[cut N bytes]`, N the bytes left out; the whole stays within the bound.
//! - The argument list keeps at most [`MAX_ARGS_LEN`] bytes (each argument counted with 10 bytes
//!   of overhead): the argument that crosses the bound is cut as a string, and the ones after it
//!   are replaced by one last argument `…[cut K arguments, M bytes]`.
//! - Stacks keep their innermost [`MAX_FRAMES`] frames; a Python line table over
//!   [`MAX_LINETABLE_LEN`] is left out (format 0: no line numbers); a build-id keeps its first
//!   [`MAX_BUILD_ID_LEN`] bytes.
//!
//! Records that fit are passed through unchanged and uncopied (events never need cutting).
//!
//! [`MAX_RECORD_LEN`]: crate::MAX_RECORD_LEN

use std::borrow::Cow;

use crate::{Module, Process, PyCode, PyStack, Record, Stack, Thread, MAX_FRAMES};

/// The longest string field written, in bytes.
pub const MAX_FIELD_LEN: usize = 64 * 1024;
/// The most bytes of arguments a Process record holds (each argument counted with 10 more).
pub const MAX_ARGS_LEN: usize = 512 * 1024;
/// The longest Python line table written; a longer one is left out.
pub const MAX_LINETABLE_LEN: usize = 256 * 1024;
/// The longest build-id written.
pub const MAX_BUILD_ID_LEN: usize = 256;
/// What each argument costs beyond its bytes when the argument list is measured.
const ARG_OVERHEAD: usize = 10;

/// `s` if it is at most `max` bytes long, else its first bytes and `…[cut N bytes]`, together
/// at most `max` bytes (`max` must leave room for the marker: 32 bytes do).
pub fn cut(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    // The marker's length with as many digits as the whole length has: never less than needed.
    let marker_len = marker(s.len()).len();
    let mut keep = max.saturating_sub(marker_len);
    while !s.is_char_boundary(keep) {
        keep -= 1;
    }
    Cow::Owned(format!("{}{}", &s[..keep], marker(s.len() - keep)))
}

fn marker(n: usize) -> String {
    format!("…[cut {n} bytes]")
}

/// `rec` as it may be written: itself when it fits, else a copy with its long fields cut.
pub fn fitted(rec: &Record) -> Cow<'_, Record> {
    let long = |s: &str| s.len() > MAX_FIELD_LEN;
    match rec {
        Record::Event(_) | Record::Stats(_) | Record::Unknown(_) => Cow::Borrowed(rec),
        Record::Process(p) => {
            let args_len: usize = p.args.iter().map(|a| a.len() + ARG_OVERHEAD).sum();
            if !long(&p.exe) && args_len <= MAX_ARGS_LEN && !p.args.iter().any(|a| long(a)) {
                return Cow::Borrowed(rec);
            }
            Cow::Owned(Record::Process(Process { exe: cut_field(&p.exe), args: fit_args(&p.args), ..p.clone() }))
        }
        Record::Api(a) if long(&a.name) => {
            let mut a = a.clone();
            a.name = cut_field(&a.name);
            Cow::Owned(Record::Api(a))
        }
        Record::Module(m) if long(&m.path) || m.build_id.len() > MAX_BUILD_ID_LEN => {
            Cow::Owned(Record::Module(Module {
                path: cut_field(&m.path),
                build_id: m.build_id[..m.build_id.len().min(MAX_BUILD_ID_LEN)].to_vec(),
                ..m.clone()
            }))
        }
        Record::Stack(s) if s.frames.len() > MAX_FRAMES => {
            Cow::Owned(Record::Stack(Stack { id: s.id, frames: s.frames[..MAX_FRAMES].to_vec() }))
        }
        Record::Notice(n) if long(n) => Cow::Owned(Record::Notice(cut_field(n))),
        Record::PyCode(c)
            if long(&c.name) || long(&c.qualname) || long(&c.filename) || c.linetable.len() > MAX_LINETABLE_LEN =>
        {
            let big_table = c.linetable.len() > MAX_LINETABLE_LEN;
            Cow::Owned(Record::PyCode(PyCode {
                id: c.id,
                name: cut_field(&c.name),
                qualname: cut_field(&c.qualname),
                filename: cut_field(&c.filename),
                firstlineno: c.firstlineno,
                linetable_format: if big_table { crate::line_table_format::NONE } else { c.linetable_format },
                linetable: if big_table { Vec::new() } else { c.linetable.clone() },
            }))
        }
        Record::PyStack(s) if s.frames.len() > MAX_FRAMES => {
            Cow::Owned(Record::PyStack(PyStack { id: s.id, frames: s.frames[..MAX_FRAMES].to_vec() }))
        }
        Record::Phase(ph) if long(&ph.name) => {
            let mut ph = ph.clone();
            ph.name = cut_field(&ph.name);
            Cow::Owned(Record::Phase(ph))
        }
        Record::AggPhase(a) if long(&a.name) => Cow::Owned(Record::AggPhase(crate::AggPhase { name: cut_field(&a.name), ..a.clone() })),
        Record::Thread(t) if long(&t.name) => {
            Cow::Owned(Record::Thread(Thread { tid: t.tid, name: cut_field(&t.name), python: t.python }))
        }
        _ => Cow::Borrowed(rec),
    }
}

fn cut_field(s: &str) -> String {
    cut(s, MAX_FIELD_LEN).into_owned()
}

/// The argument list within [`MAX_ARGS_LEN`] (see the module notes).
fn fit_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = 0;
    for (i, a) in args.iter().enumerate() {
        let a = cut(a, MAX_FIELD_LEN);
        // Room for this argument and the final marker, should one be needed.
        let room = MAX_ARGS_LEN.saturating_sub(used + 2 * ARG_OVERHEAD + 64);
        if a.len() <= room {
            used += a.len() + ARG_OVERHEAD;
            out.push(a.into_owned());
            continue;
        }
        let mut rest = &args[i..];
        if room >= 256 {
            out.push(cut(&a, room).into_owned());
            rest = &args[i + 1..];
        }
        if !rest.is_empty() {
            let bytes: usize = rest.iter().map(|a| a.len()).sum();
            out.push(format!("…[cut {} arguments, {bytes} bytes]", rest.len()));
        }
        break;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Encoder, Event, PyFrame, Reader, HEADER_LEN, MAX_RECORD_LEN};

    #[test]
    fn long_strings_are_cut_at_a_character_and_marked_within_the_bound() {
        assert!(matches!(cut("short", 100), Cow::Borrowed("short")));
        let s = "é".repeat(1000); // 2000 bytes
        let c = cut(&s, 100);
        assert!(c.len() <= 100, "{}", c.len());
        let kept = c.find('…').unwrap();
        assert_eq!(kept % 2, 0, "cut between the bytes of a character");
        assert!(c.ends_with(&format!("…[cut {} bytes]", 2000 - kept)), "{c}");
        let c = cut(&s, MAX_FIELD_LEN);
        assert_eq!(c, s, "within the bound: unchanged");
    }

    fn encoded_len(rec: &Record) -> usize {
        let mut out = Vec::new();
        Encoder::new().encode(rec, &mut out);
        out.len()
    }

    fn roundtrip(rec: &Record) -> Record {
        let mut bytes = crate::header().to_vec();
        Encoder::new().encode(rec, &mut bytes);
        assert!(bytes.len() - HEADER_LEN <= MAX_RECORD_LEN as usize + 16);
        let mut r = Reader::new(&bytes[..]).unwrap();
        r.next_record().unwrap().unwrap()
    }

    fn process(exe: String, args: Vec<String>) -> Record {
        Record::Process(Process { pid: 1, ppid: 0, start_monotonic_ns: 0, start_realtime_ns: 0, exe, args, max_frames: 64, rank: None, local_rank: None })
    }

    #[test]
    fn a_huge_argument_list_is_cut_and_the_record_reads() {
        // 10 arguments of 120 000 bytes (the kernel's limit per argument is 128 KiB): 1.2 MB.
        let args: Vec<String> = (0..10).map(|i| format!("{i}").repeat(120_000)).collect();
        let rec = process("/bin/prog".into(), args.clone());
        assert!(encoded_len(&rec) <= MAX_RECORD_LEN as usize + 16);
        let Record::Process(p) = roundtrip(&rec) else { panic!() };
        assert_eq!(p.exe, "/bin/prog");
        assert!(p.args[0].starts_with("000") && p.args[0].ends_with("bytes]"), "each argument is cut at 64 KiB");
        assert!(p.args[0].len() <= MAX_FIELD_LEN);
        let last = p.args.last().unwrap();
        assert!(last.starts_with("…[cut ") && last.ends_with(" bytes]") && last.contains("arguments"), "{last}");
        let kept: usize = p.args.iter().map(|a| a.len()).sum();
        assert!(kept <= MAX_ARGS_LEN && kept > MAX_ARGS_LEN / 2, "{kept}");

        // Many small arguments: the count is bounded too.
        let args: Vec<String> = (0..300_000).map(|_| "ab".to_string()).collect();
        let Record::Process(p) = roundtrip(&process("/bin/prog".into(), args)) else { panic!() };
        assert!(p.args.len() < 300_000);
        let last = p.args.last().unwrap();
        let dropped: usize = last.trim_start_matches("…[cut ").split(' ').next().unwrap().parse().unwrap();
        assert_eq!(dropped + p.args.len() - 1, 300_000, "{last}");
    }

    #[test]
    fn records_that_fit_are_written_unchanged() {
        let rec = process("/bin/prog".into(), vec!["prog".into(), "--flag".into()]);
        assert!(matches!(fitted(&rec), Cow::Borrowed(_)));
        assert_eq!(roundtrip(&rec), rec);
        let ev = Record::Event(Event::default());
        assert!(matches!(fitted(&ev), Cow::Borrowed(_)));
    }

    #[test]
    fn every_long_field_is_cut() {
        let long = "x".repeat(2 * MAX_RECORD_LEN as usize);
        let recs = [
            Record::Notice(long.clone()),
            Record::Module(Module { id: 1, bias: 0, start: 0, end: 1, path: long.clone(), build_id: vec![7; 5000] }),
            Record::Thread(Thread { tid: 1, name: long.clone(), python: false }),
            Record::Phase(crate::Phase { time_ns: 0, tid: 1, op: crate::PhaseOp::Push, name: long.clone() }),
            Record::PyCode(PyCode {
                id: 1,
                name: long.clone(),
                qualname: long.clone(),
                filename: long.clone(),
                firstlineno: 1,
                linetable_format: 2,
                linetable: vec![0; 2 * MAX_RECORD_LEN as usize],
            }),
            Record::Stack(Stack { id: 1, frames: vec![u64::MAX; 5000] }),
            Record::PyStack(PyStack { id: 1, frames: vec![PyFrame { code: u32::MAX, instr_offset: u32::MAX, flags: 1 }; 5000] }),
        ];
        for rec in &recs {
            assert!(encoded_len(rec) <= MAX_RECORD_LEN as usize + 16, "{:?}", std::mem::discriminant(rec));
            match roundtrip(rec) {
                Record::Notice(n) => assert!(n.len() <= MAX_FIELD_LEN && n.ends_with("bytes]")),
                Record::Module(m) => assert!(m.path.ends_with("bytes]") && m.build_id.len() == MAX_BUILD_ID_LEN),
                Record::Thread(t) => assert!(t.name.ends_with("bytes]")),
                Record::Phase(p) => assert!(p.name.ends_with("bytes]")),
                Record::PyCode(c) => assert!(c.filename.ends_with("bytes]") && c.linetable.is_empty() && c.linetable_format == 0),
                Record::Stack(s) => assert_eq!(s.frames.len(), MAX_FRAMES),
                Record::PyStack(s) => assert_eq!(s.frames.len(), MAX_FRAMES),
                other => panic!("{other:?}"),
            }
        }
    }
}
