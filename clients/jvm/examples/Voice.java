// Why: the voice path end to end with this library: a WAV is sent to the `voice` pipeline as
// 100 ms audio frames (16 kHz mono), and the spoken reply is written to a WAV. As `kazeia ask
// --audio`: at most 19 s of it as fast as the socket takes it (the daemon holds 20 s of a turn's
// audio ahead of its speech task and drops what comes past that: error busy, audio overrun);
// --realtime sends it at its own pace, as a microphone would: then the user's turn ends at the
// first pause the end-of-turn model calls complete, and speech after it interrupts the reply
// (barge-in). Usage:
//   java -cp kazeia-client.jar:. Voice [--socket PATH] [--realtime] IN.wav OUT.wav
import java.nio.ByteBuffer;
import java.nio.file.Path;

import org.kazeia.client.Client;
import org.kazeia.client.Event;
import org.kazeia.client.KazeiaException;
import org.kazeia.client.Options;
import org.kazeia.client.Pcm;
import org.kazeia.client.Turn;
import org.kazeia.client.TurnRequest;
import org.kazeia.client.TurnResult;
import org.kazeia.client.Wav;

public final class Voice {
    /** The longest clip sent as fast as the socket takes it (the daemon keeps 20 s in flight). */
    private static final double AT_ONCE_SECONDS = 19;

    public static void main(String[] args) {
        Path socket = Client.defaultSocket();
        boolean realtime = false;
        int i = 0;
        while (i < args.length && args[i].startsWith("--")) {
            if (args[i].equals("--socket") && i + 1 < args.length) {
                socket = Path.of(args[i + 1]);
                i += 2;
            } else if (args[i].equals("--realtime")) {
                realtime = true;
                i++;
            } else {
                break;
            }
        }
        if (args.length - i != 2) {
            System.err.println("usage: Voice [--socket PATH] [--realtime] IN.wav OUT.wav");
            System.exit(2);
        }
        Pcm in = Wav.read(Path.of(args[i])).toMono16k();
        Path out = Path.of(args[i + 1]);
        if (!realtime && in.seconds() > AT_ONCE_SECONDS) {
            System.err.printf("the recording is %.1f s: at most %.0f s is sent at once (the daemon holds 20 s of a turn's audio);"
                    + " --realtime streams it as a microphone would (its turn ends at a pause)%n", in.seconds(), AT_ONCE_SECONDS);
            System.exit(2);
        }
        try (Client client = Client.connect(socket, new Options().clientName("kazeia-jvm-voice"))) {
            Turn turn = client.turn(TurnRequest.audio("voice", in.sampleRate(), in.channels()));
            if (realtime) {
                paced(turn, in);
            } else {
                turn.streamAudio(in);
            }
            TurnResult r = turn.await();
            Event.Transcript heard = r.transcript();
            System.err.println("[heard: " + (heard == null ? "" : heard.text()) + "]");
            System.out.println(r.text());
            Pcm reply = r.audio();
            if (reply == null) {
                System.err.println("no audio in the reply (stop: " + r.stop() + ")");
                System.exit(1);
            }
            Wav.write(out, reply);
            System.err.printf("[reply: %.1f s at %d Hz written to %s; stop: %s]%n", reply.seconds(), reply.sampleRate(), out, r.stop());
        } catch (KazeiaException e) {
            System.err.println("error [" + e.code() + "]: " + e.messageOnly());
            System.exit(1);
        } catch (InterruptedException e) {
            System.exit(130);
        }
    }

    /** 100 ms frames, each sent when the clip has played up to its start (16 kHz mono: 3,200 bytes). */
    private static void paced(Turn turn, Pcm clip) throws InterruptedException {
        ByteBuffer all = clip.data().duplicate();
        int chunk = clip.sampleRate() / 10 * 2 * clip.channels();
        long start = System.nanoTime();
        int i = 0;
        do { // an empty clip: one empty frame, flagged last
            long wait = start + i++ * 100_000_000L - System.nanoTime();
            if (wait > 0) {
                Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
            }
            ByteBuffer part = all.slice();
            int n = Math.min(chunk, part.remaining());
            part.limit(n);
            all.position(all.position() + n);
            if (!turn.sendAudio(part, !all.hasRemaining())) {
                return; // the turn ended (its reply done, or an error)
            }
        } while (all.hasRemaining());
    }
}
