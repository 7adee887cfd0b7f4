// The page's logic: the server owns the game (python-chess checks every move, clocks run there);
// this script draws the state it returns and sends the human's moves.
import {Chessboard, COLOR, INPUT_EVENT_TYPE, FEN} from "./vendor/cm-chessboard/src/Chessboard.js"
import {Markers, MARKER_TYPE} from "./vendor/cm-chessboard/src/extensions/markers/Markers.js"
import {PromotionDialog, PROMOTION_DIALOG_RESULT_TYPE} from "./vendor/cm-chessboard/src/extensions/promotion-dialog/PromotionDialog.js"

const $ = (id) => document.getElementById(id)
const board = new Chessboard($("board"), {
    position: FEN.start,
    assetsUrl: "/static/vendor/cm-chessboard/assets/",
    style: {animationDuration: 150},
    extensions: [{class: Markers, props: {autoMarkers: MARKER_TYPE.square}}, {class: PromotionDialog}],
})

let state = null        // the last state from the server
let stateAt = 0         // performance.now() when it arrived (for the running clock)
let busy = false        // a request is in flight

async function api(method, path, body) {
    const init = {method, headers: {"Content-Type": "application/json"}}
    if (body !== undefined) init.body = JSON.stringify(body)
    const response = await fetch(path, init)
    const data = await response.json()
    if (!response.ok) throw new Error(data.error || response.statusText)
    return data
}

function setStatus(text, error = false) {
    $("status").textContent = text
    $("status").classList.toggle("error", error)
}

function fmtClock(seconds) {
    if (seconds === null || seconds === undefined) return "–"
    const s = Math.max(0, seconds)
    const m = Math.floor(s / 60)
    const rest = s - 60 * m
    return s < 10 ? `${m}:${rest.toFixed(1).padStart(4, "0")}` : `${m}:${String(Math.floor(rest)).padStart(2, "0")}`
}

function humanColour() { return state.settings.human_colour }
function engineColour() { return humanColour() === "white" ? "black" : "white" }

function drawClocks() {
    if (!state) return
    const running = state.result ? null : state.turn
    for (const [slot, colour] of [["top", engineColour()], ["bottom", humanColour()]]) {
        let left = state.clocks[colour]
        if (left !== null && running === colour) left -= (performance.now() - stateAt) / 1000
        $(`time-${slot}`).textContent = fmtClock(left)
        $(`clock-${slot}`).classList.toggle("running", running === colour)
    }
}

function drawMoves() {
    const list = $("moves")
    list.innerHTML = ""
    for (let i = 0; i < state.san.length; i += 2) {
        const li = document.createElement("li")
        li.textContent = state.san[i] + (state.san[i + 1] ? " " + state.san[i + 1] : "")
        list.appendChild(li)
    }
    list.scrollTop = list.scrollHeight
}

function drawEngineInfo() {
    const info = state.last_engine_move
    $("engine-info").hidden = !info
    if (!info) return
    $("ei-move").textContent = info.san
    $("ei-think").textContent = `${info.predicted_think_s.toFixed(1)} s`
    $("ei-value").textContent = (info.value_white >= 0 ? "+" : "") + info.value_white.toFixed(2)
    $("ei-sims").textContent = String(info.sims)
    $("ei-top").textContent = info.top_moves.map(([san, p]) => `${san} ${(100 * p).toFixed(0)}%`).join(", ")
}

function describe() {
    if (state.result) return `Game over: ${state.result} (${state.termination}). Download the PGN below.`
    if (state.engine_to_move) return "Allie is thinking…"
    return "Your move."
}

async function render(next) {
    state = next
    stateAt = performance.now()
    await board.setPosition(state.fen, true)
    board.removeMarkers(MARKER_TYPE.frame)
    const last = state.moves[state.moves.length - 1]
    if (last) {
        board.addMarker(MARKER_TYPE.frame, last.slice(0, 2))
        board.addMarker(MARKER_TYPE.frame, last.slice(2, 4))
    }
    drawClocks()
    drawMoves()
    drawEngineInfo()
    setStatus(describe())
    $("resign").disabled = !!state.result
    $("pgn").href = `/api/pgn?id=${encodeURIComponent(state.id)}`
    $("pgn").classList.toggle("disabled", !state.result)
    board.disableMoveInput()
    if (!state.result && !state.engine_to_move) {
        board.enableMoveInput(onMoveInput, humanColour() === "white" ? COLOR.white : COLOR.black)
    }
    // set last, once the board is drawn and takes input (tests wait on these)
    document.body.dataset.ply = String(state.moves.length)
    document.body.dataset.status = state.result ? "over" : state.engine_to_move ? "engine" : "human"
}

async function request(method, path, body) {
    busy = true
    try {
        return await api(method, path, body)
    } catch (err) {
        setStatus(err.message, true)
        return null
    } finally {
        busy = false
    }
}

async function engineTurn() {
    const next = await request("POST", "/api/engine", {id: state.id})
    if (next) await render(next)
}

async function sendMove(uci) {
    board.disableMoveInput()
    const next = await request("POST", "/api/move", {id: state.id, uci})
    if (!next) {  // refused: show the server's reason and the real position again
        const msg = $("status").textContent
        await render(await api("GET", `/api/state?id=${encodeURIComponent(state.id)}`))
        setStatus(msg, true)
        return
    }
    await render(next)
    if (state.engine_to_move) await engineTurn()
}

function onMoveInput(event) {
    const legal = state.legal_moves
    switch (event.type) {
        case INPUT_EVENT_TYPE.moveInputStarted:
            return legal.some((m) => m.startsWith(event.squareFrom))
        case INPUT_EVENT_TYPE.validateMoveInput: {
            const candidates = legal.filter((m) => m.slice(0, 4) === event.squareFrom + event.squareTo)
            if (candidates.length === 0) return false
            if (candidates.length > 1) {  // a promotion: ask which piece
                board.showPromotionDialog(event.squareTo, humanColour() === "white" ? COLOR.white : COLOR.black, (result) => {
                    if (result.type === PROMOTION_DIALOG_RESULT_TYPE.pieceSelected) {
                        sendMove(event.squareFrom + event.squareTo + result.piece.charAt(1))
                    } else {
                        render(state)
                    }
                })
                return true
            }
            setTimeout(() => sendMove(candidates[0]))
            return true
        }
    }
    return true
}

async function newGame(ev) {
    ev.preventDefault()
    const form = new FormData($("settings"))
    const settings = {
        human_colour: form.get("human_colour"),
        engine_elo: parseInt(form.get("engine_elo"), 10),
        human_elo: parseInt(form.get("human_elo"), 10),
        mode: form.get("mode"),
        base_s: 60 * parseFloat(form.get("base_min")),
        increment_s: parseFloat(form.get("increment_s")),
        human_pacing: form.get("human_pacing") === "on",
    }
    const next = await request("POST", "/api/new", settings)
    if (!next) return
    await board.setOrientation(next.settings.human_colour === "white" ? COLOR.white : COLOR.black)
    $("name-top").textContent = `Allie (${settings.mode}, ${settings.engine_elo})`
    $("name-bottom").textContent = `You (${settings.human_elo})`
    await render(next)
    if (state.engine_to_move) await engineTurn()
}

async function resign() {
    const next = await request("POST", "/api/resign", {id: state.id})
    if (next) await render(next)
}

async function poll() {  // keeps the clocks honest: the server decides when a flag falls
    if (!state || state.result || busy) return
    try {
        const next = await api("GET", `/api/state?id=${encodeURIComponent(state.id)}`)
        if (next.result && !state.result) await render(next)
        else { state.clocks = next.clocks; stateAt = performance.now() }
    } catch (err) { /* the next poll retries */ }
}

async function init() {
    const info = await api("GET", "/api/info")
    const select = document.querySelector("select[name=mode]")
    for (const mode of info.modes) {
        const option = document.createElement("option")
        option.value = option.textContent = mode
        if (mode === info.defaults.mode) option.selected = true
        select.appendChild(option)
    }
    $("checkpoint").textContent = `checkpoint: ${info.checkpoint}`
    $("settings").addEventListener("submit", newGame)
    $("resign").addEventListener("click", resign)
    setInterval(drawClocks, 100)
    setInterval(poll, 1000)
    document.body.dataset.status = "ready"
}

window.currentId = () => (state ? state.id : null)  // for tests and the console

init().catch((err) => setStatus(`cannot reach the server: ${err.message}`, true))
