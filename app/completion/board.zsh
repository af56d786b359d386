# zsh's front: the words on the line to _board_candidates; what it finds to compadd, which quotes each word.
_board() {
    local -a _board_reply
    local _board_files _board_prefix _board_kind _board_subs _board_opts _board_args
    _board_candidates "${words[CURRENT]}" "${(@)words[2,CURRENT-1]}"
    [ -n "$_board_prefix" ] && compset -P '*='
    compadd -- "${_board_reply[@]}"
    [ "$_board_files" = 1 ] && _files
    return 0
}
# Autoloaded from site-functions, this file is _board's body: define, then complete; sourced, register it.
if [ "${funcstack[1]-}" = "_board" ]; then
    _board "$@"
else
    compdef _board board
fi
