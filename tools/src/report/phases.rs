//! The `phases` report: allocations per phase (gpumemtrace_push/mark, NVTX ranges) and memory
//! group, and the phases' spans (JSON).

use std::io::{self, Write};

use crate::error::json_error;
use crate::model::Trace;
use crate::units::size;

pub fn render(t: &Trace, json: bool, w: &mut dyn Write) -> io::Result<()> {
    if json {
        let rows: Vec<_> = t
            .by_phase
            .iter()
            .map(|((k, n), u)| {
                let mut row = serde_json::json!({"phase": n, "device": k.device, "kind": k.kind.name(),
                    "allocations": u.allocations, "allocated_bytes": u.bytes, "failed": u.failed});
                // An aggregate trace (no spans) has each phase's peak instead.
                if let Some(peak) = t.phase_peaks.get(&(*k, n.clone())) {
                    row["peak_bytes"] = (*peak).into();
                }
                row
            })
            .collect();
        let v = serde_json::json!({"phases": rows, "spans": t.spans, "spans_merged_within_ns": t.spans_merged_within_ns});
        serde_json::to_writer_pretty(&mut *w, &v).map_err(json_error)?;
        return writeln!(w);
    }
    if t.by_phase.is_empty() {
        writeln!(w, "no allocations")?;
    }
    let peaks = t.aggregate.is_some();
    write!(w, "{:<24} {:<11} {:<13} {:>11} {:>12} {:>7}", "phase", "device", "kind", "allocations", "allocated", "failed")?;
    writeln!(w, "{}", if peaks { format!(" {:>12}", "group peak") } else { String::new() })?;
    for ((k, n), u) in &t.by_phase {
        let name = if n.is_empty() { "(none)" } else { n.as_str() };
        let device = if k.device < 0 { "host memory".to_string() } else { k.device.to_string() };
        write!(
            w,
            "{:<24} {:<11} {:<13} {:>11} {:>12} {:>7}",
            name,
            device,
            k.kind.name(),
            u.allocations,
            size(u.bytes),
            u.failed
        )?;
        let peak = t.phase_peaks.get(&(*k, n.clone())).filter(|_| peaks).map(|p| format!(" {:>12}", size(*p)));
        writeln!(w, "{}", peak.unwrap_or_default())?;
    }
    Ok(())
}
