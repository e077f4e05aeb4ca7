//! The 64-bit key of a stack (native return addresses, or Python frames as words): what a hook
//! hands over instead of the frames once its thread has sent them. The unwinder keeps each kept
//! walk's key, so a walk taken whole from memory is not hashed again.

/// 64-bit hash of a stack (0 only for no frames): a multiply-fold mix per frame, in four lanes.
pub fn hash(frames: &[u64]) -> u64 {
    let chunks = frames.chunks_exact(4);
    let rest = chunks.remainder();
    // The last few frames as one more group, padded with zeros (the length, mixed in at the end,
    // tells them apart from real zeros).
    let mut last = [0u64; 4];
    last[..rest.len()].copy_from_slice(rest);
    let tail = (!rest.is_empty()).then_some(last);
    hash_groups(frames.len(), chunks.map(|c| [c[0], c[1], c[2], c[3]]).chain(tail))
}

/// [`Lanes`] over `groups`, finished with `n` words.
#[inline(always)]
pub fn hash_groups<const L: usize>(n: usize, groups: impl IntoIterator<Item = [u64; L]>) -> u64 {
    let mut lanes = Lanes::<L>::new();
    for g in groups {
        lanes.add(g);
    }
    lanes.finish(n)
}

/// A hash of words given in groups of `L`, one lane a position in the group. A multiplication
/// waits for the one before it in its lane only: one chain of dependent multiplications (69 for
/// a Python stack of 23 frames, three words a frame) cost each one's latency, and a stack's key
/// is made anew at every allocation whose stack differs from its thread's last one. The state
/// after any number of groups can be kept and taken up again (the Python key of a stack that
/// shares its outer frames with the last one goes on from there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes<const L: usize>([u64; L]);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mix(a: u64, b: u64) -> u64 {
    let m = (a as u128).wrapping_mul(b as u128);
    (m as u64) ^ ((m >> 64) as u64)
}

impl<const L: usize> Default for Lanes<L> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const L: usize> Lanes<L> {
    /// Lanes start apart, so that the same words in two lanes do not give the same state.
    #[inline(always)]
    pub fn new() -> Self {
        let mut lanes = [0u64; L];
        for (i, l) in lanes.iter_mut().enumerate() {
            *l = 0x243F_6A88_85A3_08D3u64.wrapping_add((i as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
        }
        Lanes(lanes)
    }

    #[inline(always)]
    pub fn add(&mut self, g: [u64; L]) {
        for (l, w) in self.0.iter_mut().zip(g) {
            *l = mix(*l ^ w, K);
        }
    }

    /// The hash of the `n` words added (0 only for `n == 0`).
    #[inline(always)]
    pub fn finish(&self, n: usize) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut h = n as u64 ^ 0xD6E8_FEB8_6659_FD93;
        for l in self.0 {
            h = mix(h ^ l, K);
        }
        match mix(h, 0xD6E8_FEB8_6659_FD93) {
            0 => 1,
            h => h,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_frames_is_key_zero_and_any_frames_are_not() {
        assert_eq!(hash(&[]), 0);
        assert_ne!(hash(&[0]), 0);
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]), "order matters");
        assert_eq!(hash(&[7, 8, 9]), hash_groups(3, [[7u64, 8, 9, 0]]));
    }

    #[test]
    fn every_word_and_its_place_count() {
        let base: Vec<u64> = (1..=23).map(|i| i * 0x1000_0040).collect();
        let mut seen = std::collections::HashSet::new();
        assert!(seen.insert(hash(&base)));
        for i in 0..base.len() {
            let mut v = base.clone();
            v[i] ^= 1;
            assert!(seen.insert(hash(&v)), "word {i} changed");
            // The same words swapped between two lanes, or moved four places within a lane.
            for j in [i + 1, i + 4] {
                if j < base.len() {
                    let mut w = base.clone();
                    w.swap(i, j);
                    assert!(seen.insert(hash(&w)), "words {i} and {j} swapped");
                }
            }
        }
        // A trailing zero frame is not the padding.
        for len in 1..9 {
            let v: Vec<u64> = (1..=len).collect();
            let mut z = v.clone();
            z.push(0);
            assert_ne!(hash(&v), hash(&z), "{len} frames and a zero");
            assert!(seen.insert(hash(&z)) && seen.insert(hash(&v)));
        }
    }
}
