// The page's logic: the server owns the game (python-chess checks every move, clocks run there);
// this script draws the state it returns and sends the human's moves and requests.
import {Chessboard, COLOR, INPUT_EVENT_TYPE, FEN} from "./vendor/cm-chessboard/src/Chessboard.js"
import {Markers, MARKER_TYPE} from "./vendor/cm-chessboard/src/extensions/markers/Markers.js"
import {Arrows, ARROW_TYPE} from "./vendor/cm-chessboard/src/extensions/arrows/Arrows.js"
import {PromotionDialog, PROMOTION_DIALOG_RESULT_TYPE} from "./vendor/cm-chessboard/src/extensions/promotion-dialog/PromotionDialog.js"

const $ = (id) => document.getElementById(id)
const board = new Chessboard($("board"), {
    position: FEN.start,
    assetsUrl: "/static/vendor/cm-chessboard/assets/",
    style: {animationDuration: 150},
    extensions: [
        {class: Markers, props: {autoMarkers: MARKER_TYPE.square}},
        {class: Arrows},
        {class: PromotionDialog},
    ],
})
const ARROWS = [ARROW_TYPE.success, ARROW_TYPE.info, ARROW_TYPE.secondary]

let state = null        // the last state from the server
let stateAt = 0         // performance.now() when it arrived (for the running clock)
let busy = false        // a request is in flight
let flipped = false     // the human turned the board around
let thinkingSince = null  // performance.now() when the engine's turn was asked for

async function api(method, path, body) {
    const init = {method, headers: {"Content-Type": "application/json"}}
    if (body !== undefined) init.body = JSON.stringify(body)
    const response = await fetch(path, init)
    const data = await response.json()
    if (!response.ok) {
        const err = new Error(data.error || response.statusText)
        err.status = response.status
        throw err
    }
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

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
function humanColour() { return state.settings.human_colour }
function engineColour() { return humanColour() === "white" ? "black" : "white" }
function bottomColour() { return flipped ? engineColour() : humanColour() }
function topColour() { return bottomColour() === "white" ? "black" : "white" }

function drawNames() {
    const s = state.settings
    const name = (colour) => colour === humanColour() ? `You (${s.human_elo})` : `Allie (${s.mode}, ${s.engine_elo})`
    $("name-top").textContent = name(topColour())
    $("name-bottom").textContent = name(bottomColour())
}

function drawClocks() {
    if (!state) return
    const running = state.result || state.preparing ? null : state.turn
    for (const [slot, colour] of [["top", topColour()], ["bottom", bottomColour()]]) {
        let left = state.clocks[colour]
        if (left !== null && running === colour) left -= (performance.now() - stateAt) / 1000
        $(`time-${slot}`).textContent = fmtClock(left)
        $(`clock-${slot}`).classList.toggle("running", running === colour)
    }
    drawThink()
}

// The think-time bar: while Allie thinks, the time so far against the clock's budget for its
// move; after it moved, what it took (the bar), its budget (the whole bar) and the think time
// its model predicted for a human (the mark).
function drawThink() {
    const fill = $("think-fill"), mark = $("think-mark")
    const info = state.last_engine_move
    let spent = null, budget = null, predicted = null
    if (state.engine_thinking || (state.engine_to_move && thinkingSince !== null)) {
        budget = state.engine_budget_s
        const since = thinkingSince ?? stateAt
        spent = (performance.now() - since) / 1000
        $("think-text").textContent = budget === null ? `Allie is thinking: ${spent.toFixed(1)} s`
            : `Allie is thinking: ${spent.toFixed(1)} s of its ${budget.toFixed(1)} s budget`
    } else if (info) {
        spent = info.spent_s
        budget = info.budget_s
        predicted = info.predicted_think_s
        $("think-text").textContent = (budget === null ? `Allie took ${spent.toFixed(2)} s`
            : `Allie took ${spent.toFixed(2)} s of its ${budget.toFixed(1)} s budget`)
            + `; a human would think ${predicted.toFixed(1)} s`
    }
    $("think").hidden = spent === null
    if (spent === null) return
    const scale = budget ?? Math.max(spent, predicted ?? 0, 1)
    fill.style.width = `${Math.min(100, 100 * spent / scale)}%`
    fill.classList.toggle("over", budget !== null && spent > budget)
    mark.style.display = predicted === null ? "none" : "block"
    if (predicted !== null) mark.style.left = `${Math.min(100, 100 * predicted / scale)}%`
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

function drawArrows() {
    board.removeArrows()
    const info = state.last_engine_move
    // the engine's candidates for the move it just played, while that is the last move
    if (!$("show-arrows").checked || !info || info.ply !== state.moves.length - 1) return
    info.top_uci.forEach(([uci], i) => board.addArrow(ARROWS[Math.min(i, ARROWS.length - 1)], uci.slice(0, 2), uci.slice(2, 4)))
}

function describe() {
    if (state.result) return `Game over: ${state.result} (${state.termination}).`
    if (state.preparing) return `Preparing Allie: compiling the ${state.settings.mode} mode once. The clocks start when it is ready.`
    if (state.engine_to_move) return "Allie is thinking…"
    return "Your move."
}

async function render(next) {
    state = next
    stateAt = performance.now()
    if (!state.engine_to_move || state.result) thinkingSince = null
    await board.setOrientation(bottomColour() === "white" ? COLOR.white : COLOR.black)
    await board.setPosition(state.fen, true)
    board.removeMarkers(MARKER_TYPE.frame)
    const last = state.moves[state.moves.length - 1]
    if (last) {
        board.addMarker(MARKER_TYPE.frame, last.slice(0, 2))
        board.addMarker(MARKER_TYPE.frame, last.slice(2, 4))
    }
    drawArrows()
    drawNames()
    drawClocks()
    drawMoves()
    drawEngineInfo()
    setStatus(describe())
    $("notice").textContent = state.notice || ""
    const open = !state.result && !state.preparing
    $("resign").disabled = !open
    $("takeback").disabled = !open || !state.can_takeback
    $("draw").disabled = !open || state.engine_thinking || !state.draw_offer_open
    $("rematch").disabled = !state.result
    $("pgn").href = `/api/pgn?id=${encodeURIComponent(state.id)}`
    $("pgn").classList.toggle("disabled", state.moves.length === 0)
    board.disableMoveInput()
    if (open && !state.engine_to_move) {
        board.enableMoveInput(onMoveInput, humanColour() === "white" ? COLOR.white : COLOR.black)
    }
    // set last, once the board is drawn and takes input (tests wait on these)
    document.body.dataset.orientation = bottomColour()
    document.body.dataset.ply = String(state.moves.length)
    document.body.dataset.status = state.result ? "over" : state.preparing ? "preparing"
        : state.engine_to_move ? "engine" : "human"
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

// What happens next without the human: wait out the warm-up, let the engine move, or (after a
// reload while it thinks) wait for its move to land.
async function drive() {
    while (state && !state.result) {
        if (state.preparing || state.engine_thinking) {
            await sleep(500)
            try { await render(await api("GET", `/api/state?id=${encodeURIComponent(state.id)}`)) }
            catch (err) { setStatus(err.message, true); return }
        } else if (state.engine_to_move) {
            thinkingSince = performance.now()
            setStatus(describe())
            document.body.dataset.status = "engine"
            const next = await request("POST", "/api/engine", {id: state.id})
            if (!next) return
            await render(next)
        } else {
            return
        }
    }
}

async function show(next) {  // a game to draw and follow (new, resumed, rematch)
    history.replaceState(null, "", `?id=${encodeURIComponent(next.id)}`)
    await render(next)
    await drive()
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
    await drive()
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
    if (next) { flipped = false; await show(next) }
}

async function action(path) {  // resign, take back, offer a draw: the new state
    const next = await request("POST", path, {id: state.id})
    if (next) { await render(next); await drive() }
}

async function rematch() {
    const next = await request("POST", "/api/rematch", {id: state.id})
    if (next) { flipped = false; await show(next) }
}

async function poll() {  // keeps the clocks honest: the server decides when a flag falls
    if (!state || state.result || busy) return
    try {
        const next = await api("GET", `/api/state?id=${encodeURIComponent(state.id)}`)
        if (next.result && !state.result) await render(next)
        else { state.clocks = next.clocks; stateAt = performance.now() }
    } catch (err) { /* the next poll retries */ }
}

async function resume(id) {  // a reload, or a link to a game: pick it up where it is
    try {
        await show(await api("GET", `/api/state?id=${encodeURIComponent(id)}`))
    } catch (err) {
        history.replaceState(null, "", location.pathname)
        setStatus(`cannot resume game ${id}: ${err.message}`, true)
    }
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
    $("resign").addEventListener("click", () => action("/api/resign"))
    $("takeback").addEventListener("click", () => action("/api/takeback"))
    $("draw").addEventListener("click", () => action("/api/draw"))
    $("rematch").addEventListener("click", rematch)
    $("flip").addEventListener("click", async () => { flipped = !flipped; if (state) await render(state) })
    $("show-arrows").addEventListener("change", () => { if (state) drawArrows() })
    setInterval(drawClocks, 100)
    setInterval(poll, 1000)
    document.body.dataset.status = "ready"
    const id = new URLSearchParams(location.search).get("id")
    if (id) await resume(id)
}

window.currentId = () => (state ? state.id : null)  // for tests and the console
window.isFlipped = () => flipped

init().catch((err) => setStatus(`cannot reach the server: ${err.message}`, true))
