//! The counting test device (being built).
