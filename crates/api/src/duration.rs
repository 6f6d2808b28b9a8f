//! Durations as Istio writes them: Go's `time.ParseDuration` forms (`100ms`, `1.5s`, `1m30s`),
//! used for VirtualService timeouts and the `PILOT_*` environment variables alike; and
//! booleans as Go's `strconv.ParseBool` reads them, which istiod uses for its variables,
//! annotations and node metadata alike.

use std::time::Duration;

/// A duration that is not one of Go's `time.ParseDuration` forms.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {0:?}: write a number and a unit, e.g. 100ms, 1.5s or 1m30s")]
    Invalid(String),
    #[error("invalid duration {0:?}: missing or unknown unit (ns, us, ms, s, m or h)")]
    Unit(String),
}

/// A boolean as Go's `strconv.ParseBool` reads it; `None` when it is none.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Parses `"10s"`, `"100ms"`, `"1.5s"`, `"1h2m"`, `"0"`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(DurationError::Invalid(text.to_string()));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(DurationError::Invalid(text.to_string()));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| DurationError::Invalid(text.to_string()))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(DurationError::Unit(text.to_string()));
            }
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse() {
        assert_eq!(parse("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert!(parse("10").is_err());
        assert!(parse("fast").is_err());
    }
}
