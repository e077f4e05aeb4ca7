//! A series drawn per pixel column: the lowest and highest live bytes of the model's buckets
//! that fall in each column. The model's buckets keep the exact minimum and maximum of every
//! event in them (see `model::timeseries`), so the columns do too: a peak is never lost, however
//! many events share a pixel.

/// One column: `[x0, x1)` in pixels, the extremes in it and the value it ends at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub x0: u32,
    pub x1: u32,
    pub min: u64,
    pub max: u64,
    pub last: u64,
}

/// Columns of `points` (`(bucket start ns, min, max, last)`, as `Series::points` gives them,
/// buckets `bucket_ns` wide) over `[0, end_ns]` drawn in `columns` pixels. Consecutive columns
/// with one flat value are joined. The last value holds to the right edge.
pub fn columns(points: &[(u64, u64, u64, u64)], bucket_ns: u64, end_ns: u64, columns: u32) -> Vec<Column> {
    let n = columns.max(1);
    let col = |t: u64| ((t as f64 / end_ns.max(1) as f64) * f64::from(n)).floor().min(f64::from(n - 1)) as usize;
    // Per column: min, max, last. A bucket that overlaps several columns counts in each.
    let mut cols: Vec<Option<(u64, u64, u64)>> = vec![None; n as usize];
    for &(t, lo, hi, last) in points {
        let (c0, c1) = (col(t), col(t.saturating_add(bucket_ns).saturating_sub(1)));
        for c in &mut cols[c0..=c1.max(c0)] {
            let v = c.get_or_insert((lo, hi, last));
            v.0 = v.0.min(lo);
            v.1 = v.1.max(hi);
            v.2 = last;
        }
    }
    let mut out: Vec<Column> = Vec::new();
    let mut held = None;
    for (i, c) in cols.into_iter().enumerate() {
        // Columns without a bucket hold the previous value (none before the first).
        let Some((min, max, last)) = c.or(held.map(|v| (v, v, v))) else { continue };
        held = Some(last);
        let i = i as u32;
        match out.last_mut() {
            Some(p) if p.min == p.max && min == max && p.max == max && p.x1 == i => {
                p.x1 = i + 1;
                p.last = last;
            }
            _ => out.push(Column { x0: i, x1: i + 1, min, max, last }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_narrower_than_a_pixel_keeps_its_height() {
        // 4096 buckets of 1 µs, one of them a 1-byte-wide... spike to 1000 bytes.
        let mut points: Vec<(u64, u64, u64, u64)> = (0..4096u64).map(|i| (i * 1000, 10, 10, 10)).collect();
        points[2049] = (2049 * 1000, 10, 1000, 10);
        let c = columns(&points, 1000, 4096 * 1000, 1000);
        assert_eq!(c.iter().map(|c| c.max).max(), Some(1000));
        assert_eq!(c.iter().filter(|c| c.max == 1000).count(), 1);
        assert!(c.len() <= 3, "flat stretches are joined: {c:?}");
        assert_eq!((c[0].x0, c.last().unwrap().x1), (0, 1000));
    }

    #[test]
    fn columns_cover_the_width_and_hold_the_last_value() {
        // Two buckets of 100 ns over 1000 ns, 10 columns: the rest holds the last value.
        let c = columns(&[(0, 0, 50, 50), (100, 20, 50, 20)], 100, 1000, 10);
        assert_eq!(
            c,
            [
                Column { x0: 0, x1: 1, min: 0, max: 50, last: 50 },
                Column { x0: 1, x1: 2, min: 20, max: 50, last: 20 },
                Column { x0: 2, x1: 10, min: 20, max: 20, last: 20 },
            ]
        );
    }

    #[test]
    fn buckets_straddling_column_edges_stay_in_their_columns() {
        // 8 µs buckets over 35.5 ms in 1080 columns (about 4 buckets a column, many across an
        // edge): 64 bytes, 120 from 4.744 ms to 9.808 ms, then 64 again.
        let pts: Vec<(u64, u64, u64, u64)> = (0..4434u64)
            .map(|i| {
                let t = i * 8000;
                let v = if (4_744_000..9_808_000).contains(&t) { 120 } else { 64 };
                (t, v, v, v)
            })
            .collect();
        let c = columns(&pts, 8000, 35_467_413, 1080);
        let high: Vec<(u32, u32)> = c.iter().filter(|c| c.max == 120).map(|c| (c.x0, c.x1)).collect();
        // 4.744 ms is column 144.4, 9.808 ms column 298.6: the edge columns hold both values
        // (64 to 120), the ones between only 120.
        assert_eq!(high, [(144, 145), (145, 298), (298, 299)]);
        assert_eq!((c[1].min, c[2].min, c[3].min), (64, 120, 64));
        assert_eq!(c.len(), 5);
    }
}
