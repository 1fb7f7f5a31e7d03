"""`speclite bench`: honest side-by-side measurements of plain vs speculative decoding."""
