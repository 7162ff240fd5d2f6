//! The policy parser and validator on arbitrary text: it must return errors, never panic. A
//! policy that validates is also run through the schedule evaluation at a fixed instant.
#![no_main]

use libfuzzer_sys::fuzz_target;

struct NoAccounts;
impl dbcage::policy::Accounts for NoAccounts {
    fn uid(&self, name: &str) -> Option<u32> {
        (name == "oracle").then_some(54321)
    }
    fn gid(&self, name: &str) -> Option<u32> {
        (name == "dba").then_some(54322)
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(loaded) = dbcage::policy::from_str("fuzz.toml", text, &NoAccounts) {
        use chrono::TimeZone;
        let tz = chrono::FixedOffset::east_opt(3600).unwrap();
        let now = tz.with_ymd_and_hms(2026, 3, 29, 1, 30, 0).unwrap();
        let open = dbcage::policy::schedule::open_windows(&loaded.policy, &now);
        let _ = dbcage::policy::schedule::next_change(&loaded.policy, &now);
        // The windows laid over the policy validate or fail, never panic.
        let overlay = dbcage::policy::Overlay {
            windows: open,
            fragments: Vec::new(),
        };
        let _ = dbcage::policy::from_sources_with(
            &[("fuzz.toml".into(), text.to_string())],
            &overlay,
            &NoAccounts,
        );
    }
});
