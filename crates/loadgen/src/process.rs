//! What the simulator reads of a process (its own, and the meshd it measures) from
//! `/proc`, and how it sets up its own heap.

/// mimalloc v3's `mi_option_purge_delay` (its index in `mi_option_e`, `mimalloc.h`; the
/// Rust bindings name no constant for it): milliseconds before freed memory is returned to
/// the OS, 1,000 by default (`options.c`), -1 for never.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const DEFAULT_PURGE_DELAY: libc::c_long = 1000;

/// Freed memory stays with the allocator instead of going back to the OS a second later.
/// The simulator frees each proxy's received configuration (1.4 MB unscoped) as fast as it
/// takes the next, and with mimalloc's default it spent a large part of a connect storm
/// re-faulting and zeroing memory. meshd itself keeps the default, so that its RSS shows
/// what it holds. Does nothing when `MIMALLOC_PURGE_DELAY` is set, or when the option does
/// not read as mimalloc v3's default (a different mimalloc); returns whether it changed
/// the option. Call it first thing in `main`, before any other thread exists, in a binary
/// whose global allocator is mimalloc.
pub fn keep_freed_memory() -> bool {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return false;
    }
    // SAFETY: mi_option_get and mi_option_set take and return plain integers; the caller
    // runs this before any other thread exists (mimalloc's options are not synchronised).
    unsafe {
        if libmimalloc_sys::mi_option_get(PURGE_DELAY) != DEFAULT_PURGE_DELAY {
            return false;
        }
        libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
    }
    true
}

/// A number field (`VmRSS:`, `THP_enabled:`) of `/proc/PID/status`; `pid` is a number or
/// `self`.
fn status_number(pid: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// A process's resident memory.
pub fn resident_bytes(pid: &str) -> Option<u64> {
    status_number(pid, "VmRSS:").map(|kb| kb * 1024)
}

/// Whether a process may get transparent huge pages; `None` where the kernel does not say.
pub fn huge_pages_allowed(pid: &str) -> Option<bool> {
    status_number(pid, "THP_enabled:").map(|on| on == 1)
}

/// One GET; the body of a 200, or the error it carried.
pub fn http_get(address: &str, path: &str) -> Result<String, String> {
    let url = format!("http://{address}{path}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(&url)
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = response.status();
    let body = (response.body_mut().read_to_string()).map_err(|e| format!("GET {url}: {e}"))?;
    if status != 200 {
        return Err(format!("GET {url}: {status}: {}", body.trim()));
    }
    Ok(body)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_simulator_keeps_freed_memory_unless_told_otherwise() {
        let get = || unsafe { libmimalloc_sys::mi_option_get(super::PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            assert!(!super::keep_freed_memory());
            return;
        }
        assert_eq!(
            get(),
            super::DEFAULT_PURGE_DELAY,
            "not mimalloc v3's purge delay"
        );
        assert!(super::keep_freed_memory());
        assert_eq!(get(), -1);
    }

    #[test]
    fn a_processes_resident_memory_is_read() {
        let rss = super::resident_bytes("self").expect("VmRSS of this process");
        assert!(rss > 1 << 20, "{rss}");
        assert_eq!(super::resident_bytes("no-such-process"), None);
    }
}
