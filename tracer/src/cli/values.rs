//! The values of flags that clap does not parse by itself: durations,
//! sizes, a snap length.

use std::time::Duration;

use crate::model::MAX_SNAPLEN;

/// A `--snaplen`: 1 to what the kernel copies of each packet.
pub(super) fn parse_snaplen(text: &str) -> Result<u32, String> {
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("--snaplen takes a number of bytes, not {text:?}"))?;
    if n == 0 || n > MAX_SNAPLEN {
        return Err(format!(
            "--snaplen {n}: the kernel copies the first {MAX_SNAPLEN} bytes of each packet (headers), so 1 to {MAX_SNAPLEN}"
        ));
    }
    Ok(n)
}

/// A duration as people write it (humantime: `10s`, `500ms`, `1h 30m`); a
/// bare number is seconds. Too large a value is an error, not a panic.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit()) {
        text.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| "the number is too large".to_string())
    } else {
        humantime::parse_duration(text).map_err(|e| e.to_string())
    };
    let duration =
        parsed.map_err(|e| format!("not a duration: {text:?} ({e}; use e.g. 10s, 500ms, 2m)"))?;
    // tokio's timer cannot sleep past about 2 years from now.
    const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);
    if duration > LONGEST {
        return Err(format!("{text} is longer than a year"));
    }
    Ok(duration)
}

/// `--duration`: a trace of no time at all would attach, tell nothing and
/// detach, which is bad input, not a run.
pub fn parse_trace_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "{text}: a trace of no time traces nothing (give e.g. 10s, or leave --duration out to trace until Ctrl-C)"
        ));
    }
    Ok(duration)
}

/// A ring buffer size: bytes, or KiB / MiB; the kernel wants a power of two
/// of at least one page.
pub fn parse_ring_size(text: &str) -> Result<u32, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        _ => return Err(format!("not a size: {text} (use e.g. 4MiB or 64KiB)")),
    };
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("not a size: {text} (use e.g. 4MiB or 64KiB)"))?;
    if !(4096..=1 << 30).contains(&bytes) || !bytes.is_power_of_two() {
        return Err(format!(
            "--ring-buffer {text}: the kernel takes a power of two from 4KiB to 1GiB"
        ));
    }
    Ok(bytes as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("3 weeks").unwrap(),
            Duration::from_secs(3 * 7 * 86400)
        );
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn ring_sizes() {
        assert_eq!(parse_ring_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_ring_size("4096").unwrap(), 4096);
        assert!(parse_ring_size("3MiB").is_err());
        assert!(parse_ring_size("1KiB").is_err());
        assert!(parse_ring_size("lots").is_err());
    }

    #[test]
    fn a_trace_of_no_time_is_bad_input() {
        for zero in ["0", "0s", "0ms"] {
            let e = parse_trace_duration(zero).unwrap_err();
            assert!(e.contains("a trace of no time traces nothing"), "{e}");
        }
        assert_eq!(parse_trace_duration("1s").unwrap(), Duration::from_secs(1));
        // The API's timeout takes 0: no limit.
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn absurd_durations_are_errors_not_panics() {
        let e = parse_duration("99999999999999999999h").unwrap_err();
        assert!(e.contains("not a duration"), "{e}");
        assert!(parse_duration("99999999999999999999").is_err());
        assert!(parse_duration("20000h")
            .unwrap_err()
            .contains("longer than a year"));
    }
}
