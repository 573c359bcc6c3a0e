//! hotverbs-datapath: the no_std hot path (being built).
#![cfg_attr(not(any(test, feature = "std")), no_std)]
