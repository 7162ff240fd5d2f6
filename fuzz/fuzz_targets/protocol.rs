//! The control protocol's request parser on arbitrary bytes: refusals, never panics; what it
//! accepts encodes back to the same request, and a `set` becomes a fragment that is valid TOML
//! naming only that tenant.
#![no_main]

use dbcage::control::protocol::{parse_request, Op};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = parse_request(data) else {
        return;
    };
    assert_eq!(parse_request(&req.line()).as_ref(), Ok(&req));
    if let Op::Set { tenant, values, .. } = &req.op {
        if let Ok(text) = dbcage::control::fragment(tenant, values) {
            let table: toml::Table = text.parse().expect("a fragment is valid TOML");
            assert!(table.get("agent").is_none());
            let tenants = table["tenant"].as_array().expect("a tenant array");
            assert_eq!(tenants.len(), 1);
            assert_eq!(tenants[0]["name"].as_str(), Some(tenant.as_str()));
        }
    }
});
