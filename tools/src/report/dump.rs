//! The `dump` report: every record of a trace as JSON lines, for scripts and for checking the
//! tracer against the truth (examples/gpu/compare.py). Streams; nothing is replayed.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;

use gpumemtrace_format::{Api, MemKind, Op, Reader, Record};
use serde_json::json;

/// Address namespace of a kind: device, managed and pinned host pointers share one.
fn namespace(kind: MemKind) -> &'static str {
    if kind.namespace() == 0 {
        "pointer"
    } else {
        kind.name()
    }
}

/// Writes one JSON object per line: `{"process": ...}`, `{"module": ...}`, `{"stack": ...}`,
/// `{"event": ...}`, `{"notice": ...}`, `{"stats": ...}`; a read error ends the dump with
/// `{"error": ..., "offset": N}` and a non-zero exit. Damaged compressed frames, left out (reading
/// goes on after each), are `{"damaged": {"offset": N, "error": ...}}` lines at the end, N the
/// byte each started at; the exit status is then non-zero too.
pub fn run(path: &Path, out: &mut impl Write) -> io::Result<bool> {
    let name = crate::read::input::display(path);
    // One pass: standard input (`-`) streams as it comes.
    let file = crate::read::input::stream(path)?;
    let reader = match Reader::new(io::BufReader::new(file)) {
        Ok(r) => gpumemtrace_format::recover::Recovering::new(r, crate::read::input::recovery_beside(path)),
        Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}"))),
    };
    let mut apis: HashMap<u32, Api> = HashMap::new();
    let mut reader = reader;
    let damaged = |reader: &gpumemtrace_format::recover::Recovering<_>, out: &mut dyn Write| -> io::Result<bool> {
        for (at, why) in reader.damaged() {
            writeln!(out, "{}", json!({"damaged": {"offset": at, "error": why}}))?;
        }
        Ok(reader.damaged().is_empty())
    };
    loop {
        let value = match reader.next_record() {
            Ok(None) => return damaged(&reader, out),
            Ok(Some(rec)) => match rec {
                Record::Process(p) => json!({"process": {
                    "pid": p.pid, "ppid": p.ppid, "start_monotonic_ns": p.start_monotonic_ns,
                    "start_realtime_ns": p.start_realtime_ns, "exe": p.exe, "args": p.args,
                    "max_frames": p.max_frames}}),
                Record::Api(a) => {
                    let v = json!({"api": {"id": a.id, "name": a.name, "kind": a.kind.name(),
                        "op": if a.op == Op::Alloc { "alloc" } else { "free" }}});
                    apis.insert(a.id, a);
                    v
                }
                Record::Module(m) => json!({"module": {"id": m.id, "path": m.path, "bias": m.bias,
                    "start": m.start, "end": m.end,
                    "build_id": m.build_id.iter().map(|b| format!("{b:02x}")).collect::<String>()}}),
                Record::Stack(s) => json!({"stack": {"id": s.id, "frames": s.frames}}),
                Record::Event(e) => {
                    let (name, kind, op) = match apis.get(&e.api) {
                        Some(a) => (a.name.as_str(), a.kind, a.op),
                        None => ("?", MemKind::Device, Op::Alloc),
                    };
                    json!({"event": {"t": e.time_ns, "api": name, "kind": kind.name(),
                        "namespace": namespace(kind),
                        "op": if op == Op::Alloc { "alloc" } else { "free" },
                        "tid": e.tid, "device": e.device, "addr": e.addr, "size": e.size,
                        "stream": e.stream, "extra": e.extra, "result": e.result, "stack": e.stack,
                        "pystack": e.pystack, "flags": e.flags,
                        "total_allocated": e.total_allocated, "total_reserved": e.total_reserved}})
                }
                Record::Notice(n) => json!({"notice": n}),
                Record::Stats(s) => json!({"stats": {"events": s.events, "dropped": s.dropped, "final": s.final_}}),
                Record::PyCode(c) => json!({"pycode": {"id": c.id, "name": c.name, "qualname": c.qualname,
                    "filename": c.filename, "firstlineno": c.firstlineno,
                    "linetable_format": c.linetable_format, "linetable_len": c.linetable.len()}}),
                Record::PyStack(s) => json!({"pystack": {"id": s.id, "frames": s.frames.iter()
                    .map(|f| json!({"code": f.code, "instr_offset": f.instr_offset, "flags": f.flags}))
                    .collect::<Vec<_>>()}}),
                Record::Phase(p) => json!({"phase": {"t": p.time_ns, "tid": p.tid,
                    "op": format!("{:?}", p.op).to_lowercase(), "name": p.name}}),
                Record::Thread(t) => json!({"thread": {"tid": t.tid, "name": t.name, "python": t.python}}),
                Record::AggStart(a) => json!({"aggregate_start": {"seq": a.seq, "t": a.time_ns, "events": a.events, "final": a.final_}}),
                Record::AggSite(a) => json!({"aggregate_site": {"seq": a.seq, "device": a.device, "kind": a.kind.name(),
                    "stack": a.stack, "pystack": a.pystack, "allocations": a.allocations,
                    "allocated_bytes": a.allocated_bytes, "frees": a.frees, "live_bytes": a.live_bytes,
                    "live_count": a.live_count, "peak_bytes": a.peak_bytes, "peak_count": a.peak_count}}),
                Record::AggPeak(a) => json!({"aggregate_peak": {"seq": a.seq, "device": a.device,
                    "kind": a.kind.map(|k| k.name()), "bytes": a.bytes, "t": a.time_ns}}),
                Record::AggPhase(a) => json!({"aggregate_phase": {"seq": a.seq, "device": a.device, "kind": a.kind.name(),
                    "name": a.name, "allocations": a.allocations, "allocated_bytes": a.allocated_bytes,
                    "failed": a.failed, "peak_bytes": a.peak_bytes}}),
                Record::AggEnd(seq) => json!({"aggregate_end": {"seq": seq}}),
                Record::AggFailure(a) => json!({"aggregate_failure": {"device": a.device, "live_bytes": a.live_bytes}}),
                Record::Unknown(t) => json!({"unknown_record": t}),
            },
            Err(e) => {
                damaged(&reader, out)?;
                writeln!(out, "{}", json!({"error": e.to_string(), "offset": reader.offset()}))?;
                return Ok(false);
            }
        };
        writeln!(out, "{value}")?;
    }
}
