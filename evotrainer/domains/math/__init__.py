"""The math domain: generated arithmetic and word problems, GSM8K/MATH files, a robust verifier."""
