package main

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// quoteName returns a file name (or any name a layer or a store directory
// chose) for one field of a text line, the way git prints paths: plain
// names unchanged, and a name holding a control character, a character
// that reorders or breaks lines on display, a backslash, a double quote or
// bytes that are not UTF-8 in double quotes with C escapes ("\n", "\033",
// "\\", "\""). A name printed raw could forge further lines ("a\nD
// /etc/shadow") or send escape sequences to the terminal. Other UTF-8
// text stays as it is, as with git's core.quotePath=false.
func quoteName(s string) string {
	if !needsQuote(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	escapeTo(&b, s, true)
	b.WriteByte('"')
	return b.String()
}

// escapeMessage escapes what could forge lines or reach the terminal in a
// free-form message (an error, a problem found by check) that embeds names
// it did not quote: the same characters as quoteName except backslash and
// double quote, which are harmless in prose and would make messages that
// already quote with %q hard to read. The message stays one line.
func escapeMessage(s string) string {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unsafeRune(r, n) {
			var b strings.Builder
			b.WriteString(s[:i])
			escapeTo(&b, s[i:], false)
			return b.String()
		}
		i += n
	}
	return s
}

func needsQuote(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == '"' || r == '\\' || unsafeRune(r, n) {
			return true
		}
		i += n
	}
	return false
}

// unsafeRune reports whether the rune r, encoded in n bytes, must not be
// printed as it is: a byte that is not UTF-8, a C0 or C1 control or DEL
// (line breaks, terminal escapes), a line or paragraph separator, or a
// bidirectional control, which makes a terminal show the text in another
// order than it is.
func unsafeRune(r rune, n int) bool {
	if r == utf8.RuneError && n == 1 {
		return true
	}
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) ||
		unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}

// escapeTo writes s with unsafe runes escaped: the usual one-letter C
// escapes where they exist, every other byte of the rune in octal, as
// git does. With quotes, backslash and double quote are escaped too, so
// that the result reads back unambiguously between double quotes.
func escapeTo(b *strings.Builder, s string, quotes bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case quotes && (r == '"' || r == '\\'):
			b.WriteByte('\\')
			b.WriteByte(byte(r))
		case !unsafeRune(r, n):
			b.WriteString(s[i : i+n])
		default:
			if e := cEscape(r); e != 0 && n == 1 {
				b.WriteByte('\\')
				b.WriteByte(e)
				break
			}
			for _, c := range []byte(s[i : i+n]) {
				b.WriteByte('\\')
				b.WriteByte('0' + c>>6)
				b.WriteByte('0' + c>>3&7)
				b.WriteByte('0' + c&7)
			}
		}
		i += n
	}
}

// cEscape returns the letter of the one-letter C escape of r, or 0.
func cEscape(r rune) byte {
	switch r {
	case '\a':
		return 'a'
	case '\b':
		return 'b'
	case '\t':
		return 't'
	case '\n':
		return 'n'
	case '\v':
		return 'v'
	case '\f':
		return 'f'
	case '\r':
		return 'r'
	}
	return 0
}
