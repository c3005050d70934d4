//! trainmem-loader (being built).
