//! trainmem-optim (being built).
