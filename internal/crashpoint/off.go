//go:build !crashpoints

package crashpoint

// Compiled reports whether crash points are compiled in.
const Compiled = false

func hit(string) {}

func pause(string) {}
