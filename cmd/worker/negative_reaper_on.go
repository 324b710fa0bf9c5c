//go:build silt_negative_reaper

package main

// noReaper: this build leaves handler groups to the parent-death signal
// alone (negative control); never ship it.
const noReaper = true
