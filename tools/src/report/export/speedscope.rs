//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): one
//! "sampled" profile per device and memory kind, each stack weighted by its bytes.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::report::flamegraph::{frame_name, group_name, Of, Weighted};

pub fn render(stacks: &[Weighted], of: Of, name: &str) -> Value {
    let mut frames: Vec<Value> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut profiles: Vec<(String, Vec<Vec<usize>>, Vec<u64>)> = Vec::new();
    for w in stacks {
        let pname = format!("{} ({})", group_name(&w.key), of.name());
        if profiles.last().is_none_or(|p| p.0 != pname) {
            profiles.push((pname, vec![], vec![]));
        }
        let mut sample = Vec::new();
        for f in &w.frames {
            let key = frame_name(f);
            let i = *index.entry(key.clone()).or_insert_with(|| {
                let mut v = json!({ "name": f.function.clone().unwrap_or_else(|| key.clone()) });
                if let Some(file) = &f.file {
                    v["file"] = json!(file);
                }
                if let Some(line) = f.line {
                    v["line"] = json!(line);
                }
                frames.push(v);
                frames.len() - 1
            });
            sample.push(i);
        }
        let p = profiles.last_mut().unwrap();
        p.1.push(sample);
        p.2.push(w.bytes);
    }
    let profiles: Vec<Value> = profiles
        .into_iter()
        .map(|(n, samples, weights)| {
            let total = crate::units::total(weights.iter().copied());
            json!({
                "type": "sampled", "name": n, "unit": "bytes",
                "startValue": 0, "endValue": total,
                "samples": samples, "weights": weights
            })
        })
        .collect();
    json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames },
        "profiles": profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": "gpumemtrace"
    })
}
