//! The 64-bit key of a stack (native return addresses, or Python frames as words): what a hook
//! hands over instead of the frames once its thread has sent them. The unwinder keeps each kept
//! walk's key, so a walk taken whole from memory is not hashed again.

/// 64-bit hash of a stack (0 only for no frames): a multiply-fold mix per frame.
pub fn hash(frames: &[u64]) -> u64 {
    hash_words(frames.len(), frames.iter().copied())
}

/// [`hash`] of `n` words given one by one (no buffer needed).
pub fn hash_words(n: usize, words: impl IntoIterator<Item = u64>) -> u64 {
    if n == 0 {
        return 0;
    }
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |a: u64, b: u64| {
        let m = (a as u128).wrapping_mul(b as u128);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let mut h = n as u64 ^ 0x243F_6A88_85A3_08D3;
    for f in words {
        h = mix(h ^ f, K);
    }
    let h = mix(h, 0xD6E8_FEB8_6659_FD93);
    if h == 0 {
        1
    } else {
        h
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
        assert_eq!(hash(&[7, 8, 9]), hash_words(3, [7u64, 8, 9]));
    }
}
