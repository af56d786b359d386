# The completion's logic, one copy for bash and zsh (written in what both shells read alike); app.cli.completion puts
# the table of commands (_board_node) before it and the shell's own front after it.
#
# The words offered are data: nothing here evals them or hands them to compgen -W (which expands $(...) in its word
# list); each is matched against what was typed with a quoted [[ == "$cur"* ]] and added to an array as it is.

# _board_candidates CUR WORD...: CUR is the word being completed, the WORDs those between `board` and it.
# Sets _board_reply (the words to offer), _board_files (1: the shell's own file names too; "paths": the words are
# paths, to be quoted on the line as file names are) and _board_prefix (the "--option=" that CUR starts with, not
# part of the words offered).
_board_candidates() {
    [ -n "${ZSH_VERSION-}" ] && setopt localoptions shwordsplit noglob
    local cur=$1 node= word pending= positional=0 options_done=
    shift
    _board_reply=() _board_files= _board_prefix=
    _board_node ""
    while [ $# -gt 0 ]; do
        word=$1
        shift
        if [ -z "$options_done" ] && [ "$word" = "--" ]; then
            options_done=1
        elif [ -z "$options_done" ] && [[ $word == -* ]]; then
            [[ $word == *=* ]] && continue  # --option=value: its value is in the word
            _board_value_kind "$word"
            if [ -n "$_board_kind" ]; then
                if [ $# -gt 0 ]; then shift; else pending=$_board_kind; fi  # the next word is its value
            fi
        elif [ "$positional" -eq 0 ] && _board_is_word "$word" $_board_subs; then
            node="${node:+$node }$word"
            _board_node "$node"
        else
            positional=$((positional + 1))
        fi
    done
    if [ -n "$pending" ]; then
        _board_values "$pending" "$cur"
    elif [ -z "$options_done" ] && [[ $cur == --*=* ]]; then
        _board_prefix=${cur%%=*}=
        _board_value_kind "${cur%%=*}"
        _board_values "$_board_kind" "${cur#*=}"
    elif [ -z "$options_done" ] && [[ $cur == -* ]]; then
        for word in $_board_opts; do
            _board_offer "$cur" "${word%%=*}"
        done
    elif [ "$positional" -eq 0 ] && [ -n "$_board_subs" ]; then
        for word in $_board_subs; do
            _board_offer "$cur" "$word"
        done
    else
        # The positional's kind; the last one stands for all after it when it ends in + (nargs "*", "+", "...").
        local index=0
        for word in $_board_args; do
            if [ "$index" -eq "$positional" ] || [[ $word == *+ ]]; then
                _board_values "${word%+}" "$cur"
                break
            fi
            index=$((index + 1))
        done
    fi
    return 0
}

# _board_is_word WORD CHOICE...: WORD is one of the CHOICEs.
_board_is_word() {
    local word=$1 choice
    shift
    for choice in "$@"; do
        [ "$word" = "$choice" ] && return 0
    done
    return 1
}

# _board_value_kind OPTION: sets _board_kind to what the option's value is ("" for a flag, or an option not in the
# table: its next word is read as a word of its own).
_board_value_kind() {
    local entry
    _board_kind=
    for entry in $_board_opts; do
        if [ "${entry%%=*}" = "$1" ]; then
            [[ $entry == *=* ]] && _board_kind=${entry#*=}
            return 0
        fi
    done
}

# _board_offer CUR WORD: offer WORD if it starts with CUR (both taken literally).
_board_offer() {
    [[ $2 == "$1"* ]] && _board_reply+=("$2")
    return 0
}

# _board_values KIND CUR: what a value of this kind may be (app.cli.completion.value_kind names the kinds).
_board_values() {
    local kind=$1 cur=$2 word head=
    case $kind in
    booking) _board_ask bookings "$cur" "" ;;
    card)  # a list of cards: complete the last one after its commas
        [[ $cur == *,* ]] && head=${cur%,*},
        _board_ask cards "$cur" "$head" ;;
    model)  # the models under [llama] model_dirs; the shell's file names when none fits (./my.gguf)
        _board_ask models "$cur" ""
        if [ ${#_board_reply[@]} -eq 0 ]; then _board_files=1; else _board_files=paths; fi ;;
    file) _board_files=1 ;;
    choice:*)
        local IFS=,
        for word in ${kind#choice:}; do
            _board_offer "$cur" "$word"
        done ;;
    esac
    return 0
}

# _board_ask WHAT CUR HEAD: the live words board knows (its quick path, one socket round trip), each after HEAD;
# nothing when board or its service does not answer, and never a word on the terminal.
_board_ask() {
    local word
    while IFS= read -r word; do
        _board_offer "$2" "$3$word"
    done < <(command board __complete "$1" 2>/dev/null </dev/null)
    return 0
}
