//! trainmem-sim (being built).
