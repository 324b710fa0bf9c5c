package jsonx

import "unicode/utf8"

func decodeRune(s string) (rune, int) { return utf8.DecodeRuneInString(s) }
