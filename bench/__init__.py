"""inferq's benchmarks: ``python -m bench`` (``make bench``) starts its own stack and measures the real path end to
end. See bench/README.md."""
