#![no_std]
pub mod generated {
    #[rustfmt::skip]
    pub mod types;
    #[rustfmt::skip]
    pub mod ibverbs;
    #[rustfmt::skip]
    pub mod rdmacm;
}
