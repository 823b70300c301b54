"""HTTP edge pieces the manager, the built-in engine and the weight server share: the one error
shape (`{"error": {"message": ...}}`) and the bearer-token check."""
