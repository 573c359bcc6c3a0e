//! hotverbs: the setup layer (being built).
