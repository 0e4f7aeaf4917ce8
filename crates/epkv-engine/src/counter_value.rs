//! Parsing and formatting of INCREMENT/DECREMENT counter values.
//!
//! A counter is stored as decimal ASCII text. Reading one follows KV-Engine's
//! `safe_strtoull`: optional leading whitespace, an optional `+`, then digits, then either
//! the end of the value or a whitespace character (anything after it is ignored). epkv
//! also caps the digit run at 20 characters, the length of `u64::MAX`, as memcached does.

/// Most digits a counter may have (`u64::MAX` has 20).
const MAX_DIGITS: usize = 20;

fn is_c_space(b: u8) -> bool {
    // C `isspace` in the "C" locale.
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Returns the counter held in `value`, or `None` if it is not a decimal `u64`.
pub(crate) fn parse(value: &[u8]) -> Option<u64> {
    let mut rest = value;
    while let [b, tail @ ..] = rest
        && is_c_space(*b)
    {
        rest = tail;
    }
    if let [b'+', tail @ ..] = rest {
        rest = tail;
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > MAX_DIGITS {
        return None;
    }
    if rest.get(digits).is_some_and(|&b| !is_c_space(b)) {
        return None;
    }
    rest[..digits].iter().try_fold(0u64, |acc, &d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Returns the stored text of a counter.
pub(crate) fn format(v: u64) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_numbers_parse() {
        assert_eq!(parse(b"0"), Some(0));
        assert_eq!(parse(b"42"), Some(42));
        assert_eq!(parse(b"18446744073709551615"), Some(u64::MAX));
    }

    #[test]
    fn whitespace_and_plus_follow_strtoull() {
        assert_eq!(parse(b"  7"), Some(7));
        assert_eq!(parse(b"+7"), Some(7));
        assert_eq!(parse(b"7\r\n"), Some(7));
        assert_eq!(parse(b"7 trailing words"), Some(7));
    }

    #[test]
    fn non_numbers_are_rejected() {
        for bad in [
            &b""[..],
            b" ",
            b"abc",
            b"-1",
            b"7x",
            b"1.5",
            b"++1",
            b"18446744073709551616",
            b"000000000000000000001",
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn format_round_trips() {
        for v in [0, 1, 99, u64::MAX] {
            assert_eq!(parse(&format(v)), Some(v));
        }
    }
}
