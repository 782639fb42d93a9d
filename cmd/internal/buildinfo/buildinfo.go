// Package buildinfo holds the version stamped in at link time
// (-ldflags "-X .../buildinfo.Version=v1.2.3").
package buildinfo

// Version of the binaries; "dev" when not stamped.
var Version = "dev"
