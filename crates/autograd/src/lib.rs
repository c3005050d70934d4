//! trainmem-autograd (being built).
