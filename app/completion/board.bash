# bash's front: the words on the line, glued back where bash split them at "=" (COMP_WORDBREAKS), to
# _board_candidates; what it finds to COMPREPLY.
_board() {
    local _board_reply _board_files _board_prefix _board_kind _board_subs _board_opts _board_args
    local words=() word cur i glue=
    for ((i = 1; i <= COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if [ ${#words[@]} -gt 0 ] && { [ -n "$glue" ] || { [ "$word" = "=" ] && [[ ${words[-1]} == -* ]]; }; }; then
            words[-1]+=$word
            if [ "$word" = "=" ]; then glue=1; else glue=; fi
        else
            words+=("$word")
            glue=
        fi
    done
    cur=${words[-1]-}
    [ ${#words[@]} -gt 0 ] && unset 'words[-1]'
    _board_candidates "$cur" "${words[@]}"
    COMPREPLY=()
    for word in "${_board_reply[@]}"; do
        # Split at "=", bash completes the value alone; else the whole word, "--option=" with it.
        if [ "${COMP_WORDS[COMP_CWORD]}" = "$cur" ]; then COMPREPLY+=("$_board_prefix$word"); else COMPREPLY+=("$word"); fi
    done
    if [ -n "$_board_files" ]; then
        # Readline quotes file names on the line ($, `, ; and spaces in a model's name stay text when the line
        # runs); compopt works only inside a completion.
        compopt -o filenames 2>/dev/null
        [ "$_board_files" = paths ] || mapfile -t -O ${#COMPREPLY[@]} COMPREPLY < <(compgen -f -- "${cur#"$_board_prefix"}")
    fi
    return 0
}
complete -F _board board
