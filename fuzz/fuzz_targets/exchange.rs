//! The endpoint message parsers (`hotverbs::exchange::parse` for our binary format,
//! `parse_pingpong` for `ibv_rc_pingpong`'s text) on arbitrary bytes.
//!
//! Invariants:
//! - no input panics either parser, and every error formats to a message;
//! - binary: whatever parses was the canonical encoding: `to_bytes` gives the very same
//!   bytes back (so reserved bytes, flags and lengths are all checked), QPN/PSN fit 24 bits,
//!   and the endpoint survives the pingpong format (minus its MR window);
//! - pingpong: whatever parses re-formats to the same text up to hex case, parses back to
//!   the same endpoint, and survives our binary format.
//!
//! Planted bug (`--features planted-bug`): the pingpong formatter writes the QPN with 5 hex
//! digits' worth of bits (`& 0xfffff`), as a `%05x` typo would.
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use hotverbs::exchange::{parse, parse_pingpong, Endpoint, PINGPONG_LEN, WIRE_LEN, WIRE_LEN_MR};
use hotverbs_fuzz::display_with;
use libfuzzer_sys::fuzz_target;

/// The pingpong formatter under test (the planted bug lives here).
fn to_pingpong(ep: &Endpoint) -> [u8; PINGPONG_LEN] {
    if cfg!(feature = "planted-bug") {
        let mut t = ep.to_pingpong();
        let masked = format!("{:06x}", ep.qpn & 0x000f_ffff);
        t[5..11].copy_from_slice(masked.as_bytes());
        t
    } else {
        ep.to_pingpong()
    }
}

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(ep) => {
            assert!(data.len() == WIRE_LEN || data.len() == WIRE_LEN_MR);
            assert_eq!(ep.mr.is_some(), data.len() == WIRE_LEN_MR);
            assert!(ep.qpn <= 0x00ff_ffff && ep.psn <= 0x00ff_ffff, "{ep:?}");
            assert_eq!(
                ep.to_bytes(),
                data,
                "parse accepted a non-canonical encoding"
            );
            let text = to_pingpong(&ep);
            let back = parse_pingpong(&text).expect("our pingpong text parses");
            assert_eq!(back, Endpoint { mr: None, ..ep });
        }
        Err(e) => display_with(&e, |t| assert!(!t.is_empty())),
    }
    match parse_pingpong(data) {
        Ok(ep) => {
            assert_eq!(data.len(), PINGPONG_LEN);
            assert!(ep.mr.is_none());
            assert!(ep.qpn <= 0x00ff_ffff && ep.psn <= 0x00ff_ffff, "{ep:?}");
            let text = to_pingpong(&ep);
            assert_eq!(
                &text[..],
                &data.to_ascii_lowercase()[..],
                "pingpong text does not re-format to itself"
            );
            assert_eq!(parse_pingpong(&text).expect("re-parse"), ep);
            assert_eq!(parse(&ep.to_bytes()).expect("binary round trip"), ep);
        }
        Err(e) => display_with(&e, |t| assert!(!t.is_empty())),
    }
});
