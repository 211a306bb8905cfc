// Why: what `kazeia ask` does, written with this library: one turn, streamed to stdout, the
// verdicts, the reasoning asked for and the metrics on stderr, Ctrl-C cancels the turn. The
// daemon's text is printed with control characters other than \n and \t replaced by U+FFFD:
// a model's output must not drive the terminal (escape sequences). Usage:
//   java -cp kazeia-client.jar:. Ask [--socket PATH] [--pipeline P] [--session S]
//        [--temperature T] [--seed N] [--max-tokens N] [--thinking-budget N] [--show-thinking] TEXT
import java.nio.file.Path;
import java.util.Locale;

import org.kazeia.client.Client;
import org.kazeia.client.Event;
import org.kazeia.client.KazeiaException;
import org.kazeia.client.Options;
import org.kazeia.client.Turn;
import org.kazeia.client.TurnRequest;

public final class Ask {
    public static void main(String[] args) {
        Path socket = Client.defaultSocket();
        String pipeline = "guarded-chat";
        String text = null;
        String session = null;
        Double temperature = null;
        Long seed = null;
        Long maxTokens = null;
        Long thinkingBudget = null;
        boolean showThinking = false;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--socket": socket = Path.of(args[++i]); break;
                case "--pipeline": pipeline = args[++i]; break;
                case "--session": session = args[++i]; break;
                case "--temperature": temperature = Double.parseDouble(args[++i]); break;
                case "--seed": seed = Long.parseLong(args[++i]); break;
                case "--max-tokens": maxTokens = Long.parseLong(args[++i]); break;
                case "--thinking-budget": thinkingBudget = Long.parseLong(args[++i]); break;
                case "--show-thinking": showThinking = true; break;
                default: text = args[i];
            }
        }
        if (text == null) {
            System.err.println("usage: Ask [--socket PATH] [--pipeline P] [--session S] [--temperature T] [--seed N] [--max-tokens N]"
                    + " [--thinking-budget N] [--show-thinking] TEXT");
            System.exit(2);
        }
        TurnRequest req = TurnRequest.text(pipeline, text).session(session);
        if (temperature != null) req.temperature(temperature);
        if (seed != null) req.seed(seed);
        if (maxTokens != null) req.maxTokens(maxTokens);
        if (thinkingBudget != null) req.thinkingBudget(thinkingBudget);
        if (showThinking) req.showThinking(true);
        try (Client client = Client.connect(socket, new Options().clientName("kazeia-jvm-ask"))) {
            Turn turn = client.turn(req);
            // Ctrl-C sends the turn's cancel as the JVM exits (it does not wait for the done:
            // the JVM halts after its hooks); the closing connection would cancel it anyway.
            Thread hook = new Thread(turn::cancel);
            Runtime.getRuntime().addShutdownHook(hook);
            int code = 0;
            boolean thinking = false;
            for (Event e : turn) {
                if (thinking && !(e instanceof Event.Thinking)) {
                    System.err.println(); // the reasoning (or a piece of it) ended: what follows on its own line
                    thinking = false;
                }
                if (e instanceof Event.Accepted) {
                    System.err.println("[request " + e.id() + "]");
                } else if (e instanceof Event.Token t) {
                    System.out.print(clean(t.text()));
                    System.out.flush();
                } else if (e instanceof Event.Thinking th) {
                    // The reasoning is not the answer: stderr, as it comes (as `kazeia ask`).
                    System.err.print(clean(th.text()));
                    System.err.flush();
                    thinking = true;
                } else if (e instanceof Event.Verdict v) {
                    System.err.printf(Locale.ROOT, "[%s guard: %s, %.0f ms]%n", clean(v.stage()), clean(v.label()), v.ms());
                } else if (e instanceof Event.Done d) {
                    System.out.println();
                    String note = "eos".equals(d.stop()) ? "" : " (stopped: " + clean(d.stop()) + ")";
                    System.err.printf(Locale.ROOT, "[%d prompt + %d generated tokens, ttft %.0f ms, prefill %.1f tok/s, decode %.1f tok/s]%s%n",
                            d.metrics().promptTokens(), d.metrics().generatedTokens(), d.metrics().ttftMs(),
                            d.metrics().prefillTokS(), d.metrics().decodeTokS(), note);
                } else if (e instanceof Event.Error err) {
                    System.out.flush();
                    System.err.println("error [" + clean(err.code()) + "]: " + clean(err.message()));
                    code = 1;
                }
            }
            Runtime.getRuntime().removeShutdownHook(hook);
            System.exit(code);
        } catch (KazeiaException e) {
            System.err.println("error [" + clean(e.code()) + "]: " + clean(e.messageOnly()));
            System.exit(1);
        }
    }

    /** The daemon's text for the terminal: control characters but \n and \t become U+FFFD. */
    static String clean(String s) {
        StringBuilder b = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            b.append(Character.isISOControl(c) && c != '\n' && c != '\t' ? '\uFFFD' : c);
        }
        return b.toString();
    }
}
