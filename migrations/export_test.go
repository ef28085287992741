package migrations

import "io/fs"

// WithCore returns opts with sluice's core migrations replaced by fsys, as
// a later sluice release would ship them.
func WithCore(opts Options, fsys fs.FS) Options {
	opts.core = fsys
	return opts
}
