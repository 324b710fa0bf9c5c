//go:build !silt_negative_reaper

package main

// noReaper is true only in the negative-control build (tag
// silt_negative_reaper), which starts no handler reaper, so that the
// tests can show they catch handlers outliving a SIGKILLed worker.
const noReaper = false
