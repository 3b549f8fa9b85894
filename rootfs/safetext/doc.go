// Package safetext bounds and redacts text that derives from untrusted
// input (image configs, registry answers, file names in layers, the
// environment, URLs with credentials) before it leaves TC: in a status
// report, the spool, a log line, a span or an HTTP answer.
//
// An image can make a check or a parser produce text of any size; every
// string such input shapes goes through one of these functions at the
// point where it is made, so one rule holds everywhere: a name is quoted
// and cut to NameMax bytes, a message to its field's limit, a list to a
// few items and a count of the rest, and URLs lose their userinfo and
// query strings. The package imports nothing of the module, so every
// layer may use it.
package safetext
